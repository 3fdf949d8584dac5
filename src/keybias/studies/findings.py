"""The paper's findings: the one registry the paper, the entry page, the README and `make verify` read.

A finding is what a reader takes away: one sentence with its number, the section and figure that
show it, and the claims that decide it. The unit of evidence stays the claim (keybias.pipeline.claims);
a finding groups the few `test` claims that could have refuted it. A finding that no test claim can
refute says what it rests on instead (`basis`): a proof, or a reported measurement.

Every `test` claim of a run names exactly one finding (`decided_by`); the pipeline stamps that id on
the claim's record in `results/claims.json` and writes this registry, with its statements filled in
from the macros, to `results/findings.json`. `make verify` compares each finding's `headlines`
within the tolerance declared here, before anything else.

Statements are LaTeX with macros (`\\Name{}`), so that the paper prints them as written and every
other reader gets them with the numbers filled in (`plain_statement`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from keybias.core.claimspec import list_claims
from keybias.core.text import SUPERSCRIPT
from keybias.studies.conditions import cases as condition_cases
from keybias.studies.symbolic import judge as _symbolic_specs  # noqa: F401  (registers 01's claims)

BASES = ("test", "proof", "measurement")
SUMMARY_NUMBERS = 2
MODES = ("exact", "abs", "rel", "decades")


@dataclass(frozen=True)
class Headline:
    """A number a finding states, printed by `macro`, and how closely another run must reproduce it.

    `mode`: `exact` (a count or a setting), `abs` (|a - b| <= tolerance), `rel` (|a - b| <=
    tolerance * max(|a|, |b|)) or `decades` (|log10(a / b)| <= tolerance). `why` says where the
    tolerance comes from: it is the precision at which the finding states the number, never looser
    than the effect the finding reports.
    """

    macro: str
    mode: str
    tolerance: float = 0.0
    why: str = ""

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"headline {self.macro}: mode {self.mode!r} not one of {MODES}")
        if self.mode != "exact" and not (self.tolerance > 0 and self.why):
            raise ValueError(f"headline {self.macro}: a {self.mode} tolerance needs a value and a why")


@dataclass(frozen=True)
class Finding:
    """One finding of the paper.

    id: stable, lower-case words joined by hyphens.
    title: a few words, for a card or a table row.
    summary: the finding in one short sentence with at most two numbers, LaTeX with macros; the
        introduction lists these, so that a reader meets the findings before the methods without
        meeting every number (the section that reports the finding gives the rest).
    statement: one sentence with all its numbers, LaTeX with macros (the entry page, the README).
    section: the LaTeX label of the paper section that reports it.
    figure: the stem of the figure in results/figures/ that shows it (None: a table shows it).
    notebook: the notebook that measures and judges it.
    basis: `test` (decided by `decided_by`), `proof` or `measurement` (reported, not tested).
    decided_by: the `test` claims that could have refuted it.
    rests_on: claims of other kinds that it also uses (proof checks, controls).
    headlines: the numbers `make verify` compares, with their tolerances.
    """

    id: str
    title: str
    summary: str
    statement: str
    section: str
    figure: str | None
    notebook: str
    basis: str
    decided_by: tuple[str, ...] = ()
    rests_on: tuple[str, ...] = ()
    headlines: tuple[Headline, ...] = ()

    def __post_init__(self):
        if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", self.id):
            raise ValueError(f"finding id {self.id!r}: lower-case words joined by hyphens")
        if self.basis not in BASES:
            raise ValueError(f"finding {self.id}: basis {self.basis!r} not one of {BASES}")
        if self.basis == "test" and not self.decided_by:
            raise ValueError(f"finding {self.id}: a tested finding names the claims that decide it")
        if self.basis != "test" and self.decided_by:
            raise ValueError(f"finding {self.id}: only a tested finding is decided by claims")
        if len(_MACRO_USE.findall(self.summary)) > SUMMARY_NUMBERS:
            raise ValueError(f"finding {self.id}: a summary prints at most {SUMMARY_NUMBERS} numbers")

    def record(self, macros: dict[str, str]) -> dict:
        return {
            "id": self.id, "title": plain_statement(self.title, macros), "title_latex": self.title,
            "summary": plain_statement(self.summary, macros), "summary_latex": self.summary,
            "statement": plain_statement(self.statement, macros),
            "statement_latex": self.statement, "section": self.section, "figure": self.figure,
            "notebook": self.notebook, "basis": self.basis, "decided_by": list(self.decided_by),
            "rests_on": list(self.rests_on),
            "headlines": [{"macro": h.macro, "value": macros.get(h.macro), "mode": h.mode,
                           "tolerance": h.tolerance, "why": h.why} for h in self.headlines],
        }


_REGISTRY: dict[str, Finding] = {}


def register(finding: Finding) -> Finding:
    if finding.id in _REGISTRY:
        raise ValueError(f"finding {finding.id!r} registered twice")
    _REGISTRY[finding.id] = finding
    return finding


def list_findings() -> list[Finding]:
    """Every finding, in the order the paper tells them."""
    return list(_REGISTRY.values())


def finding_of_claims() -> dict[str, str]:
    """{test claim id: the finding it decides}; a claim named by two findings is an error."""
    out: dict[str, str] = {}
    for f in _REGISTRY.values():
        for cid in f.decided_by:
            if cid in out:
                raise ValueError(f"claim {cid!r} decides both {out[cid]!r} and {f.id!r}")
            out[cid] = f.id
    return out


def _exact(macro: str) -> Headline:
    return Headline(macro, "exact")


# -- plain text from LaTeX with macros -----------------------------------------------------------
_MACRO_USE = re.compile(r"\\([A-Za-z]+)\{\}")


def latex_number_to_text(text: str) -> str:
    """`1.2\\times10^{-3}` -> `1.2×10⁻³`, `2{,}290` -> `2,290`, `5\\%` -> `5%`."""
    text = re.sub(r"\\times\s*10\^\{(-?\d+)\}", lambda m: "×10" + m.group(1).translate(SUPERSCRIPT), text)
    text = re.sub(r"^10\^\{(-?\d+)\}$", lambda m: "10" + m.group(1).translate(SUPERSCRIPT), text)
    return text.replace("{,}", ",").replace(r"\%", "%")


def plain_statement(statement: str, macros: dict[str, str]) -> str:
    """The statement for readers outside LaTeX: macros filled in, markup reduced to text."""
    def fill(m: re.Match) -> str:
        name = m.group(1)
        if name in _LATEX_WORDS:
            return _LATEX_WORDS[name]
        if name not in macros:
            raise KeyError(f"macro \\{name} is not defined by any notebook")
        return latex_number_to_text(macros[name])

    text = _MACRO_USE.sub(fill, statement)
    text = re.sub(r"\\texttt\{([^}]*)\}", r"\1", text)
    text = re.sub(r"\\emph\{([^}]*)\}", r"\1", text)
    text = re.sub(r"\$([^$]*)\$", lambda m: _math_text(m.group(1)), text)
    return text.replace(r"\_", "_").replace("~", " ").replace(r"\%", "%").replace("--", "–")


_LATEX_WORDS = {"bk": "b_k", "bq": "b_q", "bv": "b_v", "ktyp": "‖k‖_typ"}


def _math_text(math: str) -> str:
    math = re.sub(r"10\^\{(-?\d+)\}", lambda m: "10" + m.group(1).translate(SUPERSCRIPT), math)
    math = re.sub(r"\\(bk|bq|bv|ktyp)\b(\{\})?", lambda m: _LATEX_WORDS[m.group(1)], math)
    for a, b in ((r"\le", "≤"), (r"\ge", "≥"), (r"\times", "×"), (r"\cdot", "·"), (r"\approx", "≈"),
                 (r"\sqrt", "√"), (r"\alpha", "α"), (r"\varepsilon", "ε"), (r"\epsilon", "ε"),
                 (r"\lambda", "λ"), (r"\pm", "±"), (r"\|", "‖"), (r"\,", " "), (r"\eta", "η"), ("g_b_q", "g_bq")):
        math = math.replace(a, b)
    return latex_number_to_text(math.replace("{", "").replace("}", ""))


# -- the findings, in the paper's order ----------------------------------------------------------
_HIGH_PRECISION, _HALF_PRECISION = ("float64", "float32"), ("bfloat16", "float16")
# every check of notebook 01 is a proof of the cancellation or its control
_SYMBOLIC_PROOFS = tuple(list_claims(notebook="01_symbolic"))

register(Finding(
    id="criterion-exact",
    title="The key bias cancels exactly",
    summary=(r"In exact arithmetic $\bk$ moves every score of a query by the same amount, so it changes nothing and its gradient is zero."),
    statement=(r"In exact arithmetic $\bk$ adds the same $q_i\cdot\bk$ to every score of query $i$, so "
               r"softmax, the output and every other gradient are unchanged and the gradient of $\bk$ is "
               r"zero; SymPy checks this on \SymGridSizes{} shapes of up to \SymGridMaxKeys{} keys."),
    section="sec:theorem", figure="symbolic_grid", notebook="01_symbolic", basis="proof",
    rests_on=_SYMBOLIC_PROOFS,
    headlines=(_exact("SymGridSizes"), _exact("SymGridMaxKeys")),
))

register(Finding(
    id="conditions-checklist",
    title="Where the criterion holds and breaks",
    summary=(r"Of \CondCaseCount{} conditions on the loss, the optimizer, the attention and the value-bias fold, \CondBrokenCount{} break the redundancy or the fold, among them soft-capping, rotated RoPE dimensions and $\bk$ before QK-norm."),
    statement=(r"Of \CondCaseCount{} conditions on the loss, the optimizer, the attention and the value-bias "
               r"fold, \CondRedundantCount{} leave the bias redundant or foldable (among them temperature, gates, "
               r"grouped-query heads, unrotated RoPE dimensions) and \CondBrokenCount{} do not (among them "
               r"soft-capping, tied query and key biases, rotated RoPE dimensions, $\bk$ before QK-norm)."),
    section="sec:conditions", figure="conditions_effects", notebook="07_conditions", basis="proof",
    rests_on=tuple(condition_cases.claim_id(c) for c in condition_cases.CASES),
    headlines=(_exact("CondCaseCount"), _exact("CondRedundantCount"), _exact("CondBrokenCount")),
))

register(Finding(
    id="need-weights-quirk",
    title=r"\texttt{need\_weights} changes PyTorch's output",
    summary=(r"With an appended key slot and a causal mask, \texttt{need\_weights} changes the output of PyTorch's \texttt{nn.MultiheadAttention}, by up to \CondQuirkZeroAttnDiff{} in float64."),
    statement=(r"With an appended key slot (\texttt{add\_bias\_kv} or \texttt{add\_zero\_attn}), a causal "
               r"\texttt{attn\_mask}, \texttt{is\_causal=True} and no key padding mask, PyTorch's "
               r"\texttt{nn.MultiheadAttention} hides the slot from every query with \texttt{need\_weights=False} "
               r"but not with \texttt{True}: the float64 outputs differ by up to \CondQuirkZeroAttnDiff{}, while "
               r"every path without appended slots agrees to rounding."),
    section="sec:invariance", figure="conditions_quirk", notebook="07_conditions", basis="test",
    # the size of the change is the measurement; the documented-behaviour checks restate PyTorch's
    # documentation against the reproducer's reference
    decided_by=("cond-quirk-add-bias-kv-need-weights-changes-output",
                "cond-quirk-add-zero-attn-need-weights-changes-output"),
    rests_on=("cond-quirk-add-bias-kv-need-weights-true-documented",
              "cond-quirk-add-zero-attn-need-weights-true-documented",
              "cond-quirk-plain-paths-agree"),
    headlines=(Headline("CondQuirkZeroAttnDiff", "rel", 0.05,
                        "a float64 effect, printed to two digits; other CPUs reproduce it to the last bits"),
               Headline("CondQuirkBiasKvDiff", "rel", 0.05,
                        "a float64 effect, printed to two digits; other CPUs reproduce it to the last bits")),
))

register(Finding(
    id="invariance-map",
    title=r"In float64 and float32, $\bk$ is redundant wherever the criterion says",
    summary=(r"Over \InvMeasured{} pairs of a configuration of PyTorch's attention paths and one of four dtypes, no float64 or float32 verdict contradicts the checklist."),
    statement=(r"Across \InvMeasured{} measured pairs of a configuration and a dtype of \texttt{nn.MultiheadAttention}, its fused "
               r"paths and attention variants in four dtypes, no float64 or float32 verdict contradicts the "
               r"criterion."),
    section="sec:invariance", figure="invariance_map", notebook="02_invariance", basis="test",
    decided_by=(*(f"invariance-independent-{d}" for d in _HIGH_PRECISION),
                "invariance-missed-breaks-float16",
                "invariance-separation-float64",
                "invariance-add-bias-kv-joint-redundant", "invariance-drop-matches-theory",
                "invariance-gradient-agrees"),
    # the half-precision counts check that rule's false alarms; their power control cannot see a
    # break much smaller than the output, so they do not decide the finding. The break margin is a
    # control; the drop's and the gradient's one-sided claims follow from the tests above
    rests_on=("invariance-power", "invariance-break-margin-float32", "invariance-float64-noise-floor",
              "invariance-float64-twin-matches-theory", "invariance-missed-breaks-float32",
              "invariance-drop-never-breaks-redundant", "invariance-gradient-never-contradicts",
              *(f"invariance-independent-{d}" for d in _HALF_PRECISION)),
    headlines=(_exact("InvMeasured"), _exact("InvContradictionsFloatSixtyFour"),
               _exact("InvContradictionsFloatThirtyTwo")),
))

register(Finding(
    id="gradient-is-rounding-noise",
    title=r"The gradient of $\bk$ is dominated by rounding noise",
    summary=(r"At $\bk=0$ its size is at most \PrecGradNoiseScaleMax{} of what rounding can leave, and it has no direction that isotropic noise would not give."),
    statement=(r"At $\bk=0$ its size is at most "
               r"\PrecGradNoiseScaleMax{} of what rounding the $n$-term sums of its rows can leave, at the scale of "
               r"$\bq$'s gradient, and on the CPU its direction is indistinguishable from "
               r"isotropic noise "
               r"(mean pairwise cosine at most \PrecBkCosMax{} in magnitude, where a systematic direction would give 1)."),
    section="sec:noise", figure="precision_gradient", notebook="03_precision", basis="test",
    decided_by=("precision-bk-gradient-within-tolerance", "precision-bk-gradient-noise-scale",
                "precision-bk-gradient-scales-with-u", "precision-bk-gradient-no-direction"),
    rests_on=("precision-bq-gradient-consistent",),
    headlines=(Headline("PrecGradNoiseScaleMax", "decades", 0.5,
                        "a ratio of rounding noise to its bound; the finding states it is below 1, which "
                        "it is by almost two decades"),
               Headline("PrecBkCosMax", "abs", 0.2,
                        "a mean cosine of pure noise, of size 1/sqrt(batches); the finding contrasts it with 1")),
))

register(Finding(
    id="precision-law",
    title=r"A large $\bk$ costs precision in proportion to its size",
    summary=(r"A large $\bk$ adds rounding error in proportion to $\|\bk\|/\ktyp$ in every dtype, but on the CPU no shipped checkpoint we measured has a $\bk$ large enough to double the error."),
    statement=(r"Although $\bk$ never changes the function, the rounding error it adds to the output grows "
               r"in proportion to $\|\bk\|/\ktyp$: the log--log slopes fitted over each dtype's four code paths are "
               r"\PrecSlopeFloatSixtyFour{}, \PrecSlopeFloatThirtyTwo{}, \PrecSlopeFloatSixteen{} and "
               r"\PrecSlopeBfloatSixteen{}$\pm$\PrecSlopeSeBfloatSixteen{} in "
               r"float64, float32, float16 and bfloat16, close to the first-order model's exponent 1, though the "
               r"model's constant is \PrecModelConstMin{} to \PrecModelConstMax{} per path rather than 1; on the CPU no shipped checkpoint "
               r"we measured reaches the size where the error doubles."),
    section="sec:noise", figure="precision_error_vs_bias", notebook="03_precision", basis="test",
    decided_by=("precision-output-change-within-tolerance", "precision-law-slope-one",
                "precision-accuracy-crossing-law"),
    # the model's constant reproduces on a held-out seed: a cross-check without an error rate
    rests_on=("precision-rounding-model-constant",),
    headlines=tuple(Headline(f"PrecSlope{name}", "abs", 0.03,
                             "a fitted slope, stated to two decimals against the model's 1; other CPUs "
                             "move it by its standard error (about 0.003)")
                    for name in ("FloatSixtyFour", "FloatThirtyTwo", "FloatSixteen", "BfloatSixteen")),
))

register(Finding(
    id="training-unchanged",
    title=r"In one small model, training without $\bk$ reaches the same accuracy",
    summary=(r"A small vision transformer reaches the same test accuracy with Adam whether it keeps $\bk$ (\TrainAccKeptAdam{}) or not (\TrainAccRemovedAdam{})."),
    statement=(r"A small vision transformer (\TrainNParams{} parameters, \TrainSteps{} steps) trained with and "
               r"without $\bk$ reaches the same test "
               r"accuracy with Adam (\TrainAccKeptAdam{} with $\bk$, \TrainAccRemovedAdam{} without) and with the slower "
               r"SGD (\TrainAccKeptSgd{} and \TrainAccRemovedSgd{}), and the two runs "
               r"differ by about as much (\TrainDivergenceRatio{} times) as a run differs from its own copy "
               r"perturbed at the rounding level."),
    section="sec:training", figure="training_curves", notebook="04_training", basis="test",
    decided_by=("train-accuracy-agrees-kept-removed", "train-divergence-within-rounding-control",
                "train-bk-gradient-within-rounding", "train-drifted-bk-never-changes-function"),
    headlines=(Headline("TrainAccKeptAdam", "abs", 0.02,
                        "a test accuracy over 359 images, stated to three digits; rounding flips a few images"),
               Headline("TrainAccRemovedAdam", "abs", 0.02,
                        "a test accuracy over 359 images, stated to three digits; rounding flips a few images")),
))

register(Finding(
    id="adam-drift-regimes",
    title="Adam turns the noise into drift, by regime",
    summary=(r"Where $\varepsilon$ lies far below the noise, Adam turns it into full-size steps that move $\bk$; in float32 at the default $\varepsilon$ the squared step falls to \LongFullRunRateFloatEpsEightMin{}--\LongFullRunRateFloatEpsEightMax{} of a full step's."),
    statement=(r"Adam divides the noise gradient of $\bk$ by its own scale. In the long runs of a byte-level "
               r"language model, where $\varepsilon$ lies far below "
               r"the noise its steps are full-size (step rate, the squared ratio of a step to a full one, "
               r"\LongFullRunRateFloatEpsTwelveMin{}--"
               r"\LongFullRunRateFloatEpsTwelveMax{} per run in float32 at $\varepsilon=10^{-12}$, "
               r"\LongFullRunRateBfloatEpsEightMin{}--\LongFullRunRateBfloatEpsEightMax{} under bfloat16 autocast "
               r"at the default $10^{-8}$); in float32 at the default they are scaled down by $\varepsilon$ "
               r"(\LongFullRunRateFloatEpsEightMin{}--\LongFullRunRateFloatEpsEightMax{}) and the drift is at most "
               r"\LongFullDampingMax{} of the small-$\varepsilon$ drift at the same seed and size; under SGD in "
               r"float32 $\bk$ only random-walks."),
    section="sec:training", figure="training_bias_norms", notebook="04_training", basis="test",
    decided_by=("train-sgd-bk-stays-put", "train-adam-drift-matches-noise-prediction",
                "adam-sgd-steps-float32-default-eps",
                "adam-default-eps-damps-drift"),
    rests_on=("adam-drift-ratio-control-bfloat16", "adam-full-steps-float32-small-eps",
              "adam-full-steps-bfloat16-default-eps", "train-adamw-bias-decay-shrinks-bk"),
    headlines=tuple(Headline(name, "rel", 0.02,
                             "computed from the recorded runs, which every machine reads as they are; printed "
                             "to two or three digits")
                    for name in (*(f"LongFullRunRate{regime}{end}" for regime in
                                   ("FloatEpsTwelve", "BfloatEpsEight", "FloatEpsEight") for end in ("Min", "Max")),
                                 "LongFullDampingMax")),
))

register(Finding(
    id="long-run-drift",
    title="The drift over a long run, and what drives it",
    summary=(r"In \LongFullMechanismRuns{} long runs a small bias of the gradient along the drift accounts for the drift's speed, at the median \LongFullNullSpeedupMedian{} times the speed Adam gives pure noise."),
    statement=(r"Over \LongFullRuns{} long runs (\LongFullSeeds{} seeds, two sizes, three Adam settings), the small model's "
               r"$\|\bk\|$ grows like $t^{\alpha}$ with median $\alpha=\LongFullExponentMedianSmall{}$ at "
               r"$\varepsilon=10^{-12}$, faster than a random walk's $1/2$, though three seeds cannot exclude one; "
               r"in the small model's float32 runs (\LongFullMechanismRuns{} of the \LongFullRuns{}) Adam's response to a small gradient bias along the drift "
               r"predicts its velocity (measured over predicted \LongFullVelocityRatioMin{} to "
               r"\LongFullVelocityRatioMax{}, while Adam on pure noise drifts \LongFullNullSpeedupMedian{} times slower at the median; "
               r"elsewhere \LongFullVelocityOutsideWrongSign{} of "
               r"\LongFullVelocityOutsideRows{} layers have the wrong sign), and in those runs noise in proportion to $\|\bk\|$ does not explain it "
               r"(elasticity \LongFullNoiseElasticity{}; noise growing with the whole key norm is not excluded, nor, in the medium model, "
               r"proportional noise)."),
    section="sec:longrun", figure="longrun_full_drift", notebook="08_longrun", basis="test",
    decided_by=("longrun-noise-not-tracking-bias",),
    # the checks the statement's other parts use: the run is long enough to tell the exponents apart,
    # the velocity is Adam's response to the gradient's bias in the full-step regime that eps = 1e-12
    # gives, and the text whose mean query the drift points along is the pinned one
    rests_on=("longrun-drift-exponent-decided", "longrun-velocity-from-gradient-bias", "longrun-velocity-null-fails",
              "adam-full-steps-float32-small-eps", "longrun-corpus-is-pinned-text"),
    headlines=(Headline("LongFullExponentMedianSmall", "abs", 0.05,
                        "a growth exponent computed from the recorded runs, which every machine reads as they "
                        "are; stated to two decimals, against the walk's 1/2 and constant velocity's 1"),
               Headline("LongFullNoiseElasticity", "abs", 0.05,
                        "computed from the recorded runs; stated to two decimals against the bound 1/2"),
               Headline("LongFullNullSpeedupMedian", "rel", 0.05,
                        "a median over seeded float64 noise walks matched to the recorded runs; stated to "
                        "two digits, against the factor of 2 the velocity check allows")),
))

register(Finding(
    id="pretrained-strip-exact",
    title=r"Stripping $\bk$ is exact wherever the tool allows it",
    summary=(r"Of \PretFamilies{} models, from PyTorch's own modules to tiny Hugging Face models and a trained MiniLM, the surgery tool handles \PretFamiliesHandled{} exactly and refuses the rest, whose attention the checklist excludes."),
    statement=(r"In the trained MiniLM encoder $\bk$ is at most \PretBkOverBqMax{} of $\bq$, and removing it "
               r"changes its unit-norm float64 sentence embeddings by at most $\PretBothDiffFloatSixtyFour{}$, within rounding; of "
               r"\PretFamilies{} models (PyTorch's own attention modules, tiny Hugging Face models and MiniLM) the tool "
               r"handles \PretFamiliesHandled{} and refuses the \PretFamiliesRefused{} whose attention the "
               r"criterion excludes."),
    section="sec:pretrained", figure="pretrained_bias_norms", notebook="05_pretrained", basis="test",
    decided_by=("pretrained-random-key-bias-within-rounding-float64",
                "pretrained-families-refusals-needed"),
    # the tool's own edits: it certifies each in float64 before it returns (consistency checks)
    rests_on=("pretrained-strip-key-bias-within-rounding-float64",
              "pretrained-fold-value-bias-within-rounding-float64",
              "pretrained-strip-and-fold-within-rounding-float64",
              "pretrained-control-detected-float32", "pretrained-control-detected-float64",
              "pretrained-families-handled-unchanged-float64",
              "pretrained-families-control-detected", "pretrained-families-decisions-as-expected"),
    headlines=(Headline("PretBkOverBqMax", "rel", 0.05,
                        "a ratio of fixed trained weights, computed in float32; printed to three digits"),
               _exact("PretFamilies"), _exact("PretFamiliesHandled"), _exact("PretFamiliesRefused")),
))

register(Finding(
    id="shipped-checkpoints",
    title=r"$\bk$ in the checkpoints that ship with packages",
    summary=(r"In a shipped multilingual encoder $\bk$ is \CkptEFiveBkOverBqMedian{} times $\bq$; subtracting it before int4 key quantization multiplies the error by \CkptQuantFourEFiveRatioMedian{}, about what subtracting the mean key does."),
    statement=(r"In the two MiniLM sentence embedders that ship with packages $\bk$ is at most "
               r"\CkptMiniLMSixBkOverBqMax{} of $\bq$, but in multilingual-e5-small it is "
               r"\CkptEFiveBkOverBqMedian{} times $\bq$ at the median layer (in the four-bit export we could read); there alone "
               r"subtracting $\bk$ before per-token int4 absmax key quantization multiplies the "
               r"attention-output error by \CkptQuantFourEFiveRatioMedian{}, near the "
               r"\CkptQuantFourEFiveControlRatioMedian{} of a positive control on the same checkpoint, and about what subtracting "
               r"the mean key does, a baseline added afterwards (the error with $\bk$ subtracted is "
               r"\CkptQuantFourTokenEFiveStripOverSmoothMedian{} times the mean key's; under per-channel absmax it is "
               r"\CkptQuantFourChannelStripOverSmoothMedian{} times)."),
    section="sec:pretrained", figure="checkpoint_bias_and_quantization", notebook="10_checkpoints", basis="measurement",
    rests_on=("checkpoints-strip-reduces-int8-error", "checkpoints-strip-reduces-int4-error",
              "checkpoints-strip-control-int8", "checkpoints-strip-control-int4"),
    headlines=(Headline("CkptMiniLMSixBkOverBqMax", "rel", 0.01,
                        "a ratio of fixed trained weights in float64; printed to three digits"),
               Headline("CkptEFiveBkOverBqMedian", "rel", 0.01,
                        "a ratio of fixed trained weights in float64; printed to three digits"),
               Headline("CkptQuantFourEFiveRatioMedian", "rel", 0.1,
                        "a ratio of two RMS errors over thousands of quantized keys; it reproduces to a few "
                        "percent")),
))

register(Finding(
    id="cost-saving",
    title=r"What $\bk$ costs",
    summary=(r"Removing $\bk$ is predicted to save at most \CostPredictedMaxPercent{}\% of a block's time on the CPU, below the \CostMinDetectablePercent{}\% our timings resolve."),
    statement=(r"A count of the bytes that removing $\bk$ saves predicts \CostPredictedMinPercent{}\% to "
               r"\CostPredictedMaxPercent{}\% of a BERT-base block's pass on the CPU, below the "
               r"\CostMinDetectablePercent{}\% our timings resolve, so they can neither confirm nor refute it; "
               r"no simultaneous interval of the measured saving reaches above \CostSavingUpperAllPercent{}\%."),
    section="sec:cost", figure="cost_time_saving", notebook="06_cost", basis="measurement",
    rests_on=("cost-saving-within-byte-prediction", "cost-saving-not-below-byte-prediction"),
    # every number here is a timing, or a prediction from the machine's measured bandwidth:
    # machine outputs, which verify never compares
    headlines=(),
))
