"""Output classes: what `make verify` compares, and how closely.

Every results file, every column of every `data/*.csv`, every macro and every claim field is
one of three classes:

- **exact**: byte-equal on any machine (configurations, counts, verdicts, symbolic results,
  claim outcomes: a claim's `holds` is never a machine value);
- **rounding**: equal within a tolerance (`TOLERANCES`), each derived from the spread measured
  between machines and instruction sets (the committed Intel AVX-512 run against a real AMD
  AVX2-only run, and a run natively against one capped at AVX2): at most about 3x that spread,
  never looser than the effect the value reports. Each tolerance records its `spread` and `why`;
- **machine**: timings, thread counts, CPU names, rendered pages: never compared.

Data columns are declared in each study's `schema.py` (`DATA_COLUMNS`), macros by name in
`MACRO_CLASSES`, claim values and bounds by each claim's spec (`keybias.core.claimspec.ClaimSpec`), whole files in `FILES`.
A printed number takes the class of the data it prints, plus the rounding of its own printing.
A column or file that is not declared fails `undeclared()` (a test runs it on a smoke run), and
the message names the exact line to add. `compare_folders` is the comparison of `make verify`;
`python -m keybias.pipeline.outputs REFERENCE CANDIDATE` compares two folders and prints the
table per class. tests/pipeline/test_verify.py plants a wrong value for each class.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from keybias.core.claimspec import list_specs, spec_of
from keybias.pipeline.findings_out import macro_definitions, read_macros
from keybias.studies import claims as study_claims
from keybias.studies.columns import cols
from keybias.studies.findings import list_findings

EXACT = "exact"
MACHINE = "machine"

# Unit roundoff per dtype (half the machine epsilon): the floor below which a measured
# rounding error is indistinguishable from zero.
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


@dataclass(frozen=True)
class Tolerance:
    """How far two values of a rounding column may lie apart, and the spread it came from.

    Both values within the floor (`floor_abs`, or `floor_u` unit roundoffs of the row's dtype or
    of `floor_dtype`) agree: below it a rounding error is indistinguishable from zero. Above it,
    with `decades` set, their ratio must lie within 10**decades (same sign, neither zero);
    otherwise |a - b| <= atol + rtol * max(|a|, |b|) + scale_factor * |reference scale_column|.
    Both NaN agree; one NaN does not. `integer` values are counts: both must be whole numbers.

    `spread` is the largest difference measured between two machines or instruction sets (the
    committed Intel AVX-512 run vs a real AMD AVX2-only run, and a smoke run native vs capped at
    AVX2); a tolerance is at most about 3x it: linear ones 3x the difference, logarithmic ones
    3x the ratio (spread in decades + log10 3 = 0.48).
    """

    why: str
    spread: str
    rtol: float = 0.0
    atol: float = 0.0
    decades: float | None = None
    floor_u: float = 0.0
    floor_dtype: str | None = None
    floor_abs: float = 0.0
    scale_column: str | None = None  # adds scale_factor * |reference row's scale_column| to atol
    scale_factor: float = 0.0
    integer: bool = False
    split_at: float | None = None  # both below: rounding level, by `decades`; else by rtol/atol
    split_u: float | None = None  # as split_at, in unit roundoffs of the row's dtype

    def floor(self, dtype: str = "float64") -> float:
        u = UNIT_ROUNDOFF.get(self.floor_dtype or dtype, UNIT_ROUNDOFF["float64"])
        return max(self.floor_abs, self.floor_u * u)

    def ratio(self, a: float, b: float, dtype: str = "float64", scale: float = 0.0) -> float:
        """|difference| / tolerance: <= 1 passes; the largest is reported by verify."""
        if math.isnan(a) or math.isnan(b):
            return 0.0 if math.isnan(a) and math.isnan(b) else math.inf
        if math.isinf(a) or math.isinf(b):
            return 0.0 if a == b else math.inf
        if a == b:
            return 0.0
        if self.integer and (a != round(a) or b != round(b)):
            return math.inf
        floor = self.floor(dtype)
        if abs(a) <= floor and abs(b) <= floor:
            return 0.0
        split = self.split_at
        if self.split_u is not None:
            split = self.split_u * UNIT_ROUNDOFF.get(dtype, UNIT_ROUNDOFF["float64"])
        if self.decades is not None and (split is None or max(abs(a), abs(b)) < split):
            if a == 0 or b == 0 or (a > 0) != (b > 0):
                return math.inf
            return abs(math.log10(abs(a) / abs(b))) / self.decades
        limit = self.atol + self.rtol * max(abs(a), abs(b))
        if self.scale_factor and math.isfinite(scale):
            limit += self.scale_factor * abs(scale)
        return abs(a - b) / limit if limit > 0 else math.inf


_NOISE_WHY = (
    "a measured rounding error, or a quantity computed from one (a measured tolerance, a ratio "
    "to it): another kernel reproduces its size, not its bits; the effect it stands against (b_k "
    "changing the output) is >= 5 decades larger"
)

TOLERANCES = {
    "f64": Tolerance(
        rtol=1e-9,
        spread="none: byte-equal on both machines (pretrained bound)",
        why="a float64 value from sums of up to ~1e6 terms; another summation order moves it by "
        "about n*u64 ~ 1e-10 relative",
    ),
    "f32": Tolerance(
        rtol=1.5e-6, atol=1e-12,
        spread="5.4e-7 relative (precision_gradients g_bq_norm, AMD)",
        why="a float32 value reduced over ~1e2-1e3 terms: another kernel moves it by a few u32",
    ),
    "noise": Tolerance(
        decades=1.6, floor_u=2.0,
        spread="1.10 decades (invariance grad_bk/grad_ratio, AMD); 0.93 (noise_floor_over_tol64)",
        why=_NOISE_WHY + "; below one ulp (2u) of the row's dtype it is zero",
    ),
    "noise32": Tolerance(
        decades=0.9, floor_u=2.0, floor_dtype="float32",
        spread="0.43 decades (training control divergences, AMD)",
        why="the noise-level control of float32 training (a run against its own bit-perturbed "
        "copy): its size reproduces; below one float32 ulp (2u = 1.2e-7) it is zero",
    ),
    "null_ratio": Tolerance(
        decades=1.1, floor_abs=0.4,
        spread="0.60 decades; 0.125 vs 0 where the change is zero on one machine (AMD)",
        why="a rounding change over its null bound: its size reproduces; below 0.4 (well inside "
        "the calibration's bound of 1) it counts as zero",
    ),
    "rms_error": Tolerance(
        rtol=0.17,
        spread="0.057 relative (precision_errors_calibration err_rms, AMD)",
        why="a root mean square over thousands of rounding errors, or a prediction from such "
        "sums: its size reproduces to a few percent; the precision law's effects are >= 2x",
    ),
    "statistic": Tolerance(
        rtol=0.2,
        spread="0.067 relative (longrun ratio_at_100000, AMD); null_factor 0.058",
        why="an average over many noise draws (mean rates, predictions from them, losses of a "
        "long run): it moves by a few percent between machines",
    ),
    "slope": Tolerance(
        atol=0.0075,
        spread="0.0025 (precision_law slope, AMD)",
        why="a fitted log-log slope of rounding error against u: another machine moves it by "
        "its standard error; the slope claim's margin is 0.1",
    ),
    "fit": Tolerance(
        rtol=0.11,
        spread="0.037 relative (precision_accuracy crossing, AMD)",
        why="a fitted constant or crossing point over measured rounding errors",
    ),
    "fit_scatter": Tolerance(
        decades=0.65,
        spread="0.17 decades (precision_law model_scatter_log10, AMD)",
        why="a standard error or residual scatter of a fit: noise of noise, its size reproduces",
    ),
    "noise_stat": Tolerance(
        atol=0.2,
        spread="0.066 (bk_mean_cos -0.019 vs +0.046, native vs AVX2-capped run); 0.020 AMD",
        why="a statistic of directions of pure rounding noise (mean cosine, consistency of unit "
        "vectors): noise of size ~1/sqrt(batches); a systematic direction would be near 1",
    ),
    "decade_grid": Tolerance(
        decades=1.0,
        spread="one grid step in 3 of 2900 rows (invariance min_detectable_eps, AMD)",
        why="a bisection on a grid of decades: rounding can move the detection by one grid "
        "step, never two",
    ),
    "accuracy": Tolerance(
        atol=0.025,
        spread="0.011 (training_bias_summary test_acc, 4 of 359 images, AMD)",
        why="a test accuracy of float32 training: rounding noise flips a few of 359 images (9 "
        "images is 2.3x the spread); a changed model moves it by >= 0.03",
    ),
    "acc_diff": Tolerance(
        atol=0.0084,
        spread="0.0028 (one image of 359, training_pairs acc_diff, AMD)",
        why="a paired accuracy difference of two float32 runs, in 1/359 steps: rounding flips "
        "about one image",
    ),
    "images": Tolerance(
        atol=3.0, integer=True,
        spread="1 image (training_pairs removed_only_correct, AMD)",
        why="a count of test images on which two float32 runs disagree: rounding flips one",
    ),
    "half_verdicts": Tolerance(
        atol=2.0, rtol=0.05, integer=True,
        spread="not yet measured on a second machine",
        why="a count of half-precision configurations judged against a rounding tolerance: a "
        "configuration near its tolerance can flip with another kernel's rounding",
    ),
    "diverge_steps": Tolerance(
        decades=0.78, floor_abs=1.0, integer=True,
        spread="0.30 decades (identical_steps 22 vs 11, AMD)",
        why="the step at which two float32 runs stop being bit-identical: set by where rounding "
        "first differs, reproducible to a factor of two",
    ),
    "trained": Tolerance(
        rtol=0.31,
        spread="0.104 relative (training_bias_trajectories norm_b_v, AMD)",
        why="a weight norm of float32 training driven by the data (b_q, b_v): runs diverge "
        "chaotically after rounding differs but land within ~10%",
    ),
    "curve": Tolerance(
        rtol=0.01,
        spread="0.0032 relative (training_curves loss_kept, AMD)",
        why="the per-step loss of a short float32 run: divergence after rounding moves it by "
        "well under a percent",
    ),
    "chaotic": Tolerance(
        decades=0.87, floor_u=2.0, floor_dtype="float32",
        spread="0.39 decades (training_bias_trajectories grad_rms_b_q, AMD); norm_b_k 0.15; "
        "random_walk_drift 0.10 (smoke, native vs AVX2-capped)",
        why="a value of float32 training after rounding noise made two runs diverge (per-step "
        "gradients, b_k under Adam, whose gradient is pure noise): reproducible in size",
    ),
    "vs_loss_control": Tolerance(
        scale_column="max_loss_rel_diff_control", scale_factor=2.0,
        spread="kept-vs-removed differences within 1x their control on Intel, 3.4x on AMD (the "
        "divergence under study, see verify report)",
        why="kept vs removed b_k differ only by rounding noise, like the noise-level control; "
        "another machine's noise moves the difference by up to twice the control's size",
    ),
    "vs_divergence_control": Tolerance(
        scale_column="final_divergence_control", scale_factor=2.0,
        spread="as vs_loss_control",
        why="as vs_loss_control, for the final parameter divergence",
    ),
    "vs_param_control": Tolerance(
        scale_column="param_divergence_control", scale_factor=2.0, floor_u=2.0, floor_dtype="float32",
        spread="as vs_loss_control",
        why="as vs_loss_control, for the parameter divergence per step",
    ),
    "walk": Tolerance(
        decades=1.07,
        spread="0.59 decades (longrun_grid norm_b_k, 1e3-step runs, AMD)",
        why="a short training run's random walk (b_k under Adam is driven by rounding noise): "
        "another CPU draws another sample of the walk; the grid's eps effect spans 4 decades",
    ),
    "effect": Tolerance(
        decades=1.6, floor_u=2.0, split_at=1e-6, rtol=1e-9,
        spread="0 above 1e-6 (byte-equal, AMD); 0.64 decades below (rounding-level rows)",
        why="a float64 effect: a real one (>= 1e-6) is reproduced to the last bits; a redundant "
        "one is float64 rounding (~1e-16), of which only the size reproduces",
    ),
    "effect32": Tolerance(
        decades=1.6, floor_u=2.0, split_u=4096, rtol=3.5e-6,
        spread="1.2e-6 relative above 1e-4 (invariance max_rel_bk, AMD); 0.74 decades below",
        why="an output change that is either a real effect of b_k (compared to a few u32) or "
        "rounding of the row's dtype (below 4096u: 2.4e-4 in float32, everything in 16-bit "
        "dtypes), of which only the size reproduces",
    ),
    "effect_mag": Tolerance(
        decades=1.6, floor_u=2.0, split_u=4096, rtol=3.4e-4,
        spread="1.1e-4 relative above 4096u (invariance_magnitudes bk_rel, AMD); 0.90 decades below",
        why="as effect32, for the output change at a set bias magnitude: the effect carries the "
        "float32 noise of the two outputs it subtracts (~1e-7 absolute)",
    ),
    "loss": Tolerance(
        rtol=0.02,
        spread="0.0065 relative (longrun_grid loss, AMD)",
        why="the training loss of a long run, averaged over a batch: another sample of the "
        "rounding walk moves it by under a percent",
    ),
    "exponent": Tolerance(
        atol=0.25,
        spread="0.17 (the long run's late-decade drift exponent, native vs AVX2-capped, 40,000 steps)",
        why="a growth exponent fitted to one long chaotic training run: another CPU draws another "
        "sample of the run; the tolerance stays below the 0.5 that separates a random walk from a "
        "systematic drift",
    ),
    "walk_long": Tolerance(
        decades=0.67,
        spread="0.19 decades (longrun_trajectory norm_b_k, 1e4 steps, AMD)",
        why="the long run's random walk: a longer walk averages more steps, so its size "
        "reproduces more closely than the grid's",
    ),
}

# Rounding-dominated and chaotic classes: one entry is one draw of rounding noise or of a chaotic
# walk, and another CPU draws another one (per-entry long-run displacements change sign; rounding
# nulls move by up to two decades). A column of such a class is compared only through the
# statistics its finding uses, per dtype: the median, the 90th percentile and the largest |value|
# above the class's floor, in decades, or linearly for a linear class; never entry by entry.
STATISTICAL = frozenset({
    "noise", "noise32", "null_ratio", "fit_scatter", "noise_stat", "chaotic", "walk", "walk_long",
    "decade_grid", "diverge_steps", "vs_loss_control", "vs_divergence_control", "vs_param_control",
})
STATISTICS = (("median", 0.5), ("90th percentile", 0.9), ("largest", 1.0))

# Columns whose entries are verdicts or counts decided near a rounding threshold: an entry whose
# measured change lies at its tolerance flips with the kernel's rounding (4 of 5,600 low-precision
# magnitudes between an Intel and an AMD CPU). They are compared as totals per dtype and value:
# each total within THRESHOLD_SLACK of the reference (at least THRESHOLD_MIN entries); a
# systematic change of the verdicts, which would move hundreds of entries, still fails.
THRESHOLD_COLUMNS = {
    ("data/invariance_magnitudes.csv", "verdict"),
    ("data/invariance.csv", "magnitudes_judged"),
}
THRESHOLD_SLACK = 0.02
THRESHOLD_MIN = 12  # three times the largest spread measured: 4 entries (Intel AVX-512 vs AMD Zen 5)

# The three tiers of `make verify`, in the order it reports them (shared/design.md).
TIER_FINDINGS, TIER_EXACT, TIER_STATS = "findings", "exact and stable data", "rounding statistics"


def tier_of(cls: str) -> str:
    if cls in ("claim outcome", "headline"):
        return TIER_FINDINGS
    if cls in STATISTICAL or cls == "threshold":
        return TIER_STATS
    return TIER_EXACT


# Printed numbers (macros, tables) carry the class of the data they print, plus half a unit in
# the last printed digit of each number for the printing itself.
STUDIES = ("symbolic", "invariance", "precision", "training", "pretrained", "cost", "conditions", "longrun", "gpu",
           "checkpoints")


def _data_columns() -> dict[str, dict[str, str]]:
    """data/<file>.csv -> column -> class, from each study's `schema.TABLES`."""
    out: dict[str, dict[str, str]] = {}
    for topic in STUDIES:
        tables = importlib.import_module(f"keybias.studies.{topic}.schema").TABLES
        for rel, columns in tables.items():
            if rel in out:
                raise ValueError(f"{rel} declared by two studies")
            out[rel] = columns
    return out


# data/<file>.csv -> column -> class ('exact', 'machine' or a key of TOLERANCES).
# To declare a new column, add its name to its study's schema.py.
DATA_COLUMNS: dict[str, dict[str, str]] = _data_columns()


@dataclass(frozen=True)
class FileClass:
    """A whole-file class: `exact` text, `rounding` text (numbers within `tolerance`), or machine."""

    cls: str
    why: str
    tolerance: str | None = None
    columns: tuple[str, ...] | None = None  # a LaTeX table's class per `&` cell, where they differ


# Whole files by pattern, first match wins. data/*.csv are compared per column, macros per macro.
FILES: list[tuple[str, FileClass]] = [
    ("machine/*", FileClass(MACHINE, "wall times and thread counts (Recorder.machine_csv)")),
    ("provenance.json", FileClass(MACHINE, "commit, versions, CPU, wall times of this run")),
    ("data/cost_timing*.csv", FileClass(MACHINE, "timings: never compared (notebook 06 writes them under machine/)")),
    ("tables/cost_timing*.tex", FileClass(MACHINE, "tables of timings")),
    # its rows hold timing-derived values too; claims.json compares each with its claim's own class
    ("tables/claims.tex", FileClass(MACHINE, "a rendering of claims.json, compared there claim by claim")),
    ("macros/provenance.tex", FileClass(MACHINE, "provenance printed in the paper")),
    ("steps/*.json", FileClass(MACHINE, "per-notebook provenance; its claims are compared in claims.json")),
    ("notebooks/*", FileClass(MACHINE, "executed notebooks and their pages: outputs carry timings")),
    ("figures/*", FileClass(MACHINE, "drawn from the compared data columns; font rasterising is machine-specific")),
    ("index.html", FileClass(MACHINE, "entry page generated from claims and provenance")),
    ("files.html", FileClass(MACHINE, "the list of every output, written with the entry page")),
    ("equations/*", FileClass(EXACT, "SymPy output: exact rational arithmetic")),
    ("claims.json", FileClass(EXACT, "compared claim by claim, classes from each claim's spec")),
    ("findings.json", FileClass("findings", "compared through each finding's headline numbers (keybias.studies.findings)")),
    ("macros/findings.tex", FileClass(EXACT, "the findings' statements, with macro names, not numbers")),
    ("macros/all.tex", FileClass(EXACT, "the list of macro files and the claim count")),
    ("macros/*_machine.tex", FileClass(MACHINE, "timings and load of this machine (Recorder.machine_macro)")),
    ("macros/*", FileClass("macros", "compared macro by macro, see MACRO_CLASSES")),
    # Tables print data columns that are compared strictly above; a table is compared with the
    # loosest class among the columns it prints, or exactly where it prints only counts.
    ("tables/cost_memory.tex", FileClass(EXACT, "byte counts")),
    ("tables/pretrained_parameters_saved.tex", FileClass(EXACT, "parameter counts")),
    ("tables/symbolic_assumptions.tex", FileClass(EXACT, "SymPy assumptions")),
    ("tables/precision_gradient.tex", FileClass(
        "rounding", "gradient ratios and mean cosines of rounding noise", "noise",
        ("exact", "exact", "exact", "noise", "noise_stat", "f32", "f32"),
    )),
    ("tables/precision_law.tex", FileClass("rounding", "slopes, constants and their scatter", "fit_scatter")),
    ("tables/training_*.tex", FileClass("rounding", "float32 training outcomes, drift included", "noise")),
    ("tables/*", FileClass("rounding", "rounding sizes printed to 3 digits; text exact", "noise")),
    ("data/*.csv", FileClass("columns", "compared per column, see DATA_COLUMNS")),
]

# Claim fields: identity and outcome exact on every machine; `holds` is never a machine value,
# whatever the claim measures. `value`/`min_detectable` and `bound` take the class of the data
# the claim reduces, declared with the claim (ClaimSpec.value_class, bound_class).
CLAIM_FIELDS = cols(
    exact="id statement comparison holds notebook device profile kind implied_by protects finding bound_origin",
    claim_value="value min_detectable",
    claim_bound="bound",
)

# macro file pattern, macro name regex (full match) -> class; first match wins, else exact.
# A printed number takes the class of the data it prints; counts and settings are exact.
_COST_MACHINE = (
    r"CostControl(HalfWidth\w*|ContainsOne|ExcludesOne|Verdict)|CostLargestPointSaving\w*|"
    r"CostMedianSaving\w*|CostMinDetectable\w*|CostReps(High|Low)|CostSavingUpper\w*|CostLoad\w*|"
    r"CostCpuModel|CostStoppedByTarget|CostSlower(|Sentence)|CostDistinguishable\w*|"
    r"CostModel(Consistent|OverPredicts|UnderPredicts)|CostSubphase(?!Count)\w*|CostCores|"
    r"CostThreads|CostBandwidthGBs|CostClock|CostCudaSentence|CostPredicted(Max|Min)Percent"
)
MACRO_CLASSES: list[tuple[str, str, str]] = [
    ("macros/06_cost.tex", _COST_MACHINE, MACHINE),  # timings and the machine that took them
    # ratios of a change to a low-precision tolerance, or of a float64 rounding change to its
    # bound: the tolerance is a measured rounding null, so the ratio is rounding-dominated
    ("macros/02_invariance.tex", r"Inv(Break|Redundant)OverTol\w+", "noise"),
    ("macros/04_training.tex", r"TrainDecayEffectOverBound", "chaotic"),
    ("macros/02_invariance.tex", r"Inv\w+(Max|Min)Rel", "effect32"),
    ("macros/02_invariance.tex", r"InvNullFactor\w+", "statistic"),
    ("macros/02_invariance.tex", r"InvMinDetect\w+", "decade_grid"),
    # a measured tolerance over a size-matched control's change: rounding-dominated below float64
    ("macros/02_invariance.tex", r"Inv(Joint|Drop|Grad)MinDetectable", "noise"),
    # verdicts in half precision, each against a rounding tolerance; the judged counts are exact
    ("macros/02_invariance.tex", r"Inv(JointRedundant|DropRedundant|DropFalseBreaks|GradContradictions)Half",
     "half_verdicts"),
    ("macros/03_precision.tex", r"PrecSlope(BfloatSixteen|FloatSixteen|FloatThirtyTwo|FloatSixtyFour)", "slope"),
    ("macros/03_precision.tex", r"PrecSlope(Se|Detectable)\w+|PrecLawResidMax", "fit_scatter"),
    ("macros/03_precision.tex", r"PrecCross\w+|PrecModelConst\w+", "fit"),
    ("macros/03_precision.tex", r"PrecBk(Consistency|Cos)Max", "noise_stat"),
    ("macros/03_precision.tex", r"PrecBq\w+|PrecCosBoundMin|PrecBkCosMinDetectable", "f32"),
    ("macros/03_precision.tex", r"PrecErrMax\w+|PrecSecondOrder\w+", "rms_error"),
    ("macros/03_precision.tex", r"PrecGrad(NoiseScaleMax|TolMax|MinDetectable)|PrecOutput(TolMax|MinDetectable)"
     r"|PrecRatioOverU\w+", "noise"),
    ("macros/04_training.tex", r"TrainAccDiscordant|TrainAccMinDetectable", "images"),
    # a tolerance over a size-matched control's change in a trained model: set by where training landed
    ("macros/04_training.tex", r"TrainVerdictMinDetectable", "trained"),
    ("macros/04_training.tex", r"TrainMaxAccDiff\w+", "acc_diff"),
    ("macros/04_training.tex", r"TrainAcc(?!ZBound|PairedImages)\w+", "accuracy"),
    ("macros/04_training.tex", r"TrainAdam(Factor|LogErr|MinDetectable)|TrainDecayDev|TrainGradRmsQuery\w+", "chaotic"),
    ("macros/04_training.tex", r"TrainDivergence(Control)?(Adam|Sgd)|TrainLossRelDiffControl\w+", "noise32"),
    ("macros/04_training.tex", r"TrainDivergence(Ratio|MinDetectable)|TrainDrift\w+|TrainGradRatio|TrainGradRmsKey\w+"
     r"|TrainLossRelDiff\w+|TrainMaxLogitDelta|TrainSgd(DriftMax|WalkRatio)", "noise"),
    ("macros/04_training.tex", r"TrainPred\w+|TrainGradDetectable", "statistic"),
    ("macros/04_training.tex", r"TrainIdenticalSteps\w+", "diverge_steps"),
    ("macros/05_pretrained.tex", r"PretControl(Diff|CosGap)\w+|PretFamilies(ControlRatio|RefusedRatio)"
     r"|Pret(Bk|Bq|Bv|Key)Norm\w+|PretBkOver\w+", "f32"),
    ("macros/05_pretrained.tex", r"Pret\w+Tol(FloatSixtyFour|FloatThirtyTwo)", "rms_error"),
    ("macros/05_pretrained.tex", r"Pret\w+(CosGap|Diff|OverNoise)\w+|PretFamilies(CertifiedMax|HandledRatio)", "noise"),
    ("macros/10_checkpoints.tex", r"CkptQuant\w+", "rms_error"),
    ("macros/10_checkpoints.tex", r"Ckpt\w+GradNoise\w*|CkptMiniLMSixDrift\w+", "noise"),
    ("macros/10_checkpoints.tex", r"Ckpt\w+BkOverKey\w+|Ckpt\w+GradBq", "f32"),
    ("macros/10_checkpoints.tex", r"CkptHeldOutMiniLMMax|Ckpt\w+BkOverBq\w+|Ckpt\w+BkNormMax", "f64"),
    ("macros/08_longrun.tex", r"LongFull\w+", "f64"),  # from the recorded grid: read, not recomputed
    ("macros/08_longrun.tex", r"Long(DriftMeasuredEnd|NormBkEnd|OutputChangeEnd|DriftMaxFactor)", "walk_long"),
    ("macros/08_longrun.tex", r"LongExponent(|Low|High|Separation)|LongLawExponent", "exponent"),
    ("macros/08_longrun.tex", r"LongRate\w+|LongStepsToKey(?!NormMin)\w+|LongRatio\w+|LongBkOverKeyEnd", "walk"),
    ("macros/08_longrun.tex", r"Long(DriftPredictedEnd|OutputPredictedEnd|KeyNorm\w+|RatioAt\w+|StepsToKeyNormMin)",
     "statistic"),
]


def claim_specs():
    """Every claim spec, with the tolerance classes of its value and bound."""
    study_claims.load()
    return list_specs()


def claim_class(cid: str, key: str) -> str:
    """The class of one claim field: CLAIM_FIELDS, then the claim's spec (`ClaimSpec.value_class`,
    `bound_class`) for measured numbers. A claim without a spec is compared exactly."""
    cls = CLAIM_FIELDS.get(key, EXACT)
    if cls == EXACT:
        return EXACT
    study_claims.load()
    try:
        spec = spec_of(cid)
    except KeyError:
        return EXACT
    return spec.bound_class if cls == "claim_bound" else spec.value_class


def macro_class(rel: str, name: str) -> str:
    for pattern, regex, cls in MACRO_CLASSES:
        if fnmatch.fnmatch(rel, pattern) and re.fullmatch(regex, name):
            return cls
    return EXACT


def file_class(rel: str) -> FileClass | None:
    for pattern, cls in FILES:
        if fnmatch.fnmatch(rel, pattern):
            return cls
    return None


def result_files(folder: Path) -> list[str]:
    """Every results file, relative, skipping build state (.build, .staging)."""
    return sorted(
        str(p.relative_to(folder)) for p in Path(folder).rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def undeclared(folder: Path) -> list[str]:
    """What a results folder holds that this module does not classify, as the lines to add."""

    missing = []
    for rel in result_files(folder):
        cls = file_class(rel)
        if cls is None:
            missing.append(f"{rel}: add a pattern to keybias.pipeline.outputs.FILES")
            continue
        if cls.cls != "columns" or file_class_is_machine(rel):
            continue
        declared = DATA_COLUMNS.get(rel)
        columns = list(pd.read_csv(Path(folder) / rel, nrows=0).columns)
        if declared is None:
            missing.append(
                f"{rel}: add DATA_COLUMNS[{rel!r}] = _cols(exact=..., f64=..., ...) covering {columns}"
            )
            continue
        for col in columns:
            if col not in declared:
                missing.append(
                    f"{rel}: column {col!r} undeclared; add it to one group "
                    f"(exact, machine or {', '.join(TOLERANCES)}) of DATA_COLUMNS[{rel!r}]"
                )
    return missing


def file_class_is_machine(rel: str) -> bool:
    cls = file_class(rel)
    return cls is not None and cls.cls == MACHINE


# -- comparison -------------------------------------------------------------------


@dataclass
class ClassTally:
    """What one output class compared: items within tolerance, failures, the largest ratio."""

    compared: int = 0
    identical: int = 0
    failed: int = 0
    worst_ratio: float = 0.0
    worst_where: str = ""


@dataclass
class Report:
    """The outcome of comparing a candidate results folder with a reference."""

    exact: int = 0
    rounding: int = 0
    rounding_identical: int = 0  # rounding items that came out byte-identical all the same
    machine: int = 0
    worst_ratio: float = 0.0
    worst_where: str = ""
    failures: list[str] = field(default_factory=list)
    by_class: dict[str, ClassTally] = field(default_factory=dict)

    def note_ratio(self, ratio: float, where: str, cls: str = "") -> None:
        """Tally one compared number of class `cls`; keep the largest ratio within tolerance
        overall and per class (failures are listed apart)."""
        tally = self.by_class.setdefault(cls, ClassTally())
        tally.compared += 1
        tally.identical += int(ratio == 0)
        if ratio > 1:
            tally.failed += 1
        if math.isfinite(ratio) and (ratio > tally.worst_ratio or not tally.worst_where):
            tally.worst_ratio, tally.worst_where = ratio, where
        if ratio <= 1 and (ratio > self.worst_ratio or not self.worst_where):
            self.worst_ratio, self.worst_where = ratio, where

    def note_exact(self, equal: bool, cls: str = EXACT) -> None:
        tally = self.by_class.setdefault(cls, ClassTally())
        tally.compared += 1
        tally.identical += int(equal)
        tally.failed += int(not equal)

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        worst = f"largest ratio to tolerance {self.worst_ratio:.3g} ({self.worst_where})" if self.worst_where else "none compared"
        lines = [
            f"{self.exact} exact and equal",
            f"{self.rounding} rounding within tolerance ({self.rounding_identical} of them "
            f"byte-identical); {worst}",
            f"{self.machine} machine-specific, not compared",
        ]
        if self.failures:
            lines.append(f"{len(self.failures)} failure(s)")
        return "; ".join(lines)

    def tier_table(self) -> list[str]:
        """One line per tier of shared/design.md, findings first: items compared, failed, and the
        largest ratio to tolerance with where it is."""
        lines = []
        for tier in (TIER_FINDINGS, TIER_EXACT, TIER_STATS):
            tallies = [(c, t) for c, t in self.by_class.items() if tier_of(c) == tier]
            compared = sum(t.compared for _, t in tallies)
            failed = sum(t.failed for _, t in tallies)
            ratios = [(t.worst_ratio, t.worst_where) for c, t in tallies if c not in (EXACT, "claim outcome") and t.worst_where]
            worst = max(ratios, default=None)
            tail = f"; largest ratio to tolerance {worst[0]:.3g} ({worst[1]})" if worst else ""
            verdict = "PASSED" if not failed else f"FAILED ({failed})"
            lines.append(f"{tier}: {verdict}: {compared} compared{tail}")
        return lines

    def class_table(self) -> list[str]:
        """One line per class: values compared, identical, beyond tolerance, the largest ratio
        (failures included) and where."""
        lines = [f"{'class':<22} {'compared':>8} {'identical':>9} {'failed':>6} {'largest ratio':>13}  where"]
        for cls in sorted(self.by_class):
            t = self.by_class[cls]
            worst = f"{t.worst_ratio:.3g}" if cls != EXACT else "-"
            lines.append(f"{cls:<22} {t.compared:>8} {t.identical:>9} {t.failed:>6} {worst:>13}  {t.worst_where}")
        return lines


_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def _row_dtype(row: dict) -> str:
    for key in ("dtype", "working_dtype"):
        if isinstance(row.get(key), str) and row[key] in UNIT_ROUNDOFF:
            return row[key]
    return "float64"


# A table without a dtype column takes each row's dtype from another table by a key column.
ROW_DTYPE_FROM = {"data/invariance_magnitudes.csv": ("config_id", "data/invariance.csv")}


def _as_float(value) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _row_dtypes(rel: str, rows: list[dict], reference: Path | None) -> list[str]:
    if rel in ROW_DTYPE_FROM and reference is not None and (reference / ROW_DTYPE_FROM[rel][1]).exists():
        key, other = ROW_DTYPE_FROM[rel]
        table = pd.read_csv(reference / other, dtype=str, keep_default_na=False)
        by_key = {r[key]: _row_dtype(r) for r in table.to_dict("records")}
        return [by_key.get(r.get(key), "float64") for r in rows]
    return [_row_dtype(r) for r in rows]


def _compare_csv(rel: str, ref: Path, new: Path, report: Report, reference: Path | None = None) -> None:
    declared = DATA_COLUMNS.get(rel, {})
    a = pd.read_csv(ref, dtype=str, keep_default_na=False)
    b = pd.read_csv(new, dtype=str, keep_default_na=False)
    if list(a.columns) != list(b.columns):
        report.failures.append(f"{rel}: columns differ: {list(a.columns)} vs {list(b.columns)}")
        return
    if len(a) != len(b):
        report.failures.append(f"{rel}: {len(a)} rows in the reference, {len(b)} regenerated")
        return
    rows_a = a.to_dict("records")
    dtypes = _row_dtypes(rel, rows_a, reference)
    for col in a.columns:
        cls = declared.get(col)
        if cls is None:
            report.failures.append(f"{rel}: column {col!r} is not declared in keybias.pipeline.outputs.DATA_COLUMNS")
            continue
        if cls == MACHINE:
            report.machine += 1
            continue
        if (rel, col) in THRESHOLD_COLUMNS:
            _compare_totals(rel, col, a[col], b[col], dtypes, report)
            continue
        if cls in STATISTICAL:
            _compare_statistics(rel, col, cls, a[col], b[col], dtypes, rows_a, report)
            continue
        bad = 0
        tol = TOLERANCES.get(cls)
        for i, (x, y) in enumerate(zip(a[col], b[col], strict=True)):
            if cls == EXACT:
                report.note_exact(x == y)
                if x != y:
                    bad += 1
                    report.failures.append(f"{rel}: column {col}, row {i}: {x!r} != {y!r} (exact)")
                continue
            fx, fy = _as_float(x if x != "" else "nan"), _as_float(y if y != "" else "nan")
            if fx is None or fy is None:
                report.note_exact(x == y, cls)
                if x != y:
                    bad += 1
                    report.failures.append(f"{rel}: column {col}, row {i}: {x!r} != {y!r} (not numbers)")
                continue
            scale = _as_float(rows_a[i].get(tol.scale_column) or "nan") if tol.scale_column else 0.0
            ratio = tol.ratio(fx, fy, dtypes[i], scale if scale is not None else math.nan)
            report.note_ratio(ratio, f"{rel}:{col} row {i}", cls)
            if ratio > 1:
                bad += 1
                report.failures.append(
                    f"{rel}: column {col}, row {i}: {x} vs {y} beyond tolerance {cls!r} "
                    f"(ratio {ratio:.3g})"
                )
        if not bad:
            if cls == EXACT:
                report.exact += 1
            else:
                report.rounding += 1
                report.rounding_identical += int(a[col].equals(b[col]))


def _compare_totals(rel: str, col: str, a, b, dtypes: list[str], report: Report) -> None:
    """A threshold column: per dtype, how many entries take each value (a categorical column) or
    their sum (a count), each within THRESHOLD_SLACK of the reference's total."""
    numeric = all(_as_float(v) is not None for v in [*a, *b])
    ok = True
    for dtype in sorted(set(dtypes)):
        rows = [i for i, d in enumerate(dtypes) if d == dtype]
        if numeric:
            totals = {"sum": (sum(float(a.iloc[i]) for i in rows), sum(float(b.iloc[i]) for i in rows))}
        else:
            values = sorted({a.iloc[i] for i in rows} | {b.iloc[i] for i in rows})
            totals = {v: (sum(a.iloc[i] == v for i in rows), sum(b.iloc[i] == v for i in rows)) for v in values}
        for what, (x, y) in totals.items():
            slack = max(THRESHOLD_MIN, THRESHOLD_SLACK * max(abs(x), abs(y)))
            ratio = abs(x - y) / slack
            report.note_ratio(ratio, f"{rel}:{col} {dtype} {what}", "threshold")
            if ratio > 1:
                ok = False
                report.failures.append(f"{rel}: column {col}, {dtype}: total {what} {x:g} vs {y:g} beyond "
                                       f"{slack:g} (threshold totals)")
    if ok:
        report.rounding += 1


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _compare_statistics(rel: str, col: str, cls: str, a, b, dtypes: list[str], rows_a: list[dict],
                        report: Report) -> None:
    """A rounding-dominated column, per dtype: its median, 90th percentile and largest |value|
    (over finite entries; one below the class's floor counts as the floor) within the class's
    tolerance; how many entries
    are finite must agree exactly. Entries are never compared one by one."""
    tol = TOLERANCES[cls]
    ok = True
    for dtype in sorted(set(dtypes)):
        rows = [i for i, d in enumerate(dtypes) if d == dtype]
        fa = [_as_float(a.iloc[i] if a.iloc[i] != "" else "nan") for i in rows]
        fb = [_as_float(b.iloc[i] if b.iloc[i] != "" else "nan") for i in rows]
        if any(v is None for v in fa + fb):  # not numbers: a text column in a rounding class
            equal = list(a.iloc[rows]) == list(b.iloc[rows])
            report.note_exact(equal, cls)
            if not equal:
                ok = False
                report.failures.append(f"{rel}: column {col}, {dtype}: text entries differ")
            continue
        finite_a = [abs(v) for v in fa if math.isfinite(v)]
        finite_b = [abs(v) for v in fb if math.isfinite(v)]
        if len(finite_a) != len(finite_b):
            ok = False
            report.failures.append(f"{rel}: column {col}, {dtype}: {len(finite_a)} finite entries in the "
                                   f"reference, {len(finite_b)} regenerated")
            continue
        floor = tol.floor(dtype)  # below it an entry is indistinguishable from zero: it counts as the floor
        scales = []
        if tol.scale_column:  # the same statistic of the reference's scale column
            scales = [_as_float(rows_a[i].get(tol.scale_column) or "nan") for i in rows]
            scales = [abs(x) for x in scales if x is not None and math.isfinite(x)]
        for name, q in STATISTICS:
            scale = _quantile(scales, q) if scales else 0.0
            x = max(_quantile(finite_a, q), floor) if finite_a else 0.0
            y = max(_quantile(finite_b, q), floor) if finite_b else 0.0
            ratio = tol.ratio(x, y, dtype, scale)
            report.note_ratio(ratio, f"{rel}:{col} {dtype} {name}", cls)
            if ratio > 1:
                ok = False
                report.failures.append(f"{rel}: column {col}, {dtype}: {name} |value| {x:.3g} vs {y:.3g} "
                                       f"beyond tolerance {cls!r} (ratio {ratio:.3g})")
    if ok:
        report.rounding += 1
        report.rounding_identical += int(a.equals(b))


def _normalise_numbers(text: str) -> str:
    """`3.3\\times10^{-15}` -> `3.3e-15`, `10^{-9}` -> `1e-9` and `2{,}284` -> `2284`, so each
    number is one token."""
    text = re.sub(r"(\d)\{,\}(\d)", r"\1\2", text)
    text = re.sub(r"(\d(?:\.\d*)?)\s*\\times\s*10\^\{?([-+]?\d+)\}?", r"\1e\2", text)
    return re.sub(r"(?<![\d.])10\^\{?([-+]?\d+)\}?", r"1e\1", text)


def _half_last_digit(token: str) -> float:
    """Half a unit in the last printed digit of a number token: its printing's own rounding."""
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return 0.5 * 10.0 ** (int(exponent or 0) - decimals)


def printed_ratio(cls: str, x: str, y: str) -> float:
    """The ratio of two printed numbers under class `cls`, after granting each number the
    rounding of its own printing (so 0.97 vs 0.9704 is no difference)."""
    fx, fy = float(x), float(y)
    tol = TOLERANCES[cls]
    if tol.integer:
        return tol.ratio(fx, fy)
    gap = abs(fx - fy)
    slack = _half_last_digit(x) + _half_last_digit(y)
    if gap <= slack:
        return 0.0
    lo, hi = (fx, fy) if fx < fy else (fy, fx)
    lo_h, hi_h = (_half_last_digit(x), _half_last_digit(y)) if fx < fy else (_half_last_digit(y), _half_last_digit(x))
    return tol.ratio(lo + lo_h, hi - hi_h)


def _compare_numbers_in_text(where: str, a: str, b: str, cls: str, report: Report) -> bool:
    """Text outside numbers equal, each number within `cls`; failures are recorded."""
    a, b = _normalise_numbers(a), _normalise_numbers(b)
    if _NUMBER.sub("#", a) != _NUMBER.sub("#", b):
        report.failures.append(f"{where}: text outside numbers differs")
        report.note_exact(False, cls)
        return False
    ok = True
    for m, n in zip(_NUMBER.finditer(a), _NUMBER.finditer(b), strict=True):
        ratio = printed_ratio(cls, m.group(), n.group())
        report.note_ratio(ratio, where, cls)
        if ratio > 1:
            ok = False
            report.failures.append(f"{where}: {m.group()} vs {n.group()} beyond tolerance {cls!r} (ratio {ratio:.3g})")
    return ok


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.rstrip().removesuffix("\\\\").split("&")]


def _compare_text(rel: str, ref: Path, new: Path, tolerance: str | None, report: Report,
                  columns: tuple[str, ...] | None = None) -> None:
    a, b = ref.read_text(), new.read_text()
    if tolerance is None:
        report.note_exact(a == b)
        if a == b:
            report.exact += 1
        else:
            report.failures.append(f"{rel}: differs (exact file)")
        return
    ok = True
    lines_a, lines_b = a.splitlines(), b.splitlines()
    if len(lines_a) != len(lines_b):
        report.failures.append(f"{rel}: {len(lines_a)} lines in the reference, {len(lines_b)} regenerated")
        return
    for i, (x, y) in enumerate(zip(lines_a, lines_b, strict=True)):
        if x == y:
            continue
        where = f"{rel} line {i + 1} ({x.strip()[:50]})"
        if columns and len(_cells(x)) == len(columns) == len(_cells(y)):
            for cls, cx, cy in zip(columns, _cells(x), _cells(y), strict=True):
                if cls == EXACT:
                    report.note_exact(cx == cy)
                    if cx != cy:
                        ok = False
                        report.failures.append(f"{where}: {cx!r} != {cy!r} (exact)")
                elif cx != cy:
                    ok &= _compare_numbers_in_text(where, cx, cy, cls, report)
            continue
        ok &= _compare_numbers_in_text(where, x, y, tolerance, report)
    if ok:
        report.rounding += 1
        report.rounding_identical += int(a == b)


def _macros(text: str) -> dict[str, str]:
    return macro_definitions(text)


def _compare_macros(rel: str, ref: Path, new: Path, report: Report, headlines: frozenset = frozenset()) -> None:
    """Each macro by its class (MACRO_CLASSES): exact text, or numbers within the class of the
    data it prints; machine macros are not compared, and findings' headlines are compared by
    `_compare_findings` with their own tolerances."""
    a, b = _macros(ref.read_text()), _macros(new.read_text())
    ok = True
    for name in sorted(set(a) | set(b)):
        cls = macro_class(rel, name)
        if name in headlines and name in a and name in b:
            continue
        if cls == MACHINE:
            report.machine += 1
            continue
        if name not in a or name not in b:
            ok = False
            report.failures.append(f"{rel}: \\{name} present only in the {'reference' if name in a else 'new run'}")
            continue
        if cls == EXACT or a[name] == b[name]:
            report.note_exact(a[name] == b[name], cls if cls != EXACT else EXACT)
            if a[name] != b[name]:
                ok = False
                report.failures.append(f"{rel}: \\{name}: {a[name]!r} != {b[name]!r} (exact)")
            continue
        ok &= _compare_numbers_in_text(f"{rel}: \\{name}", a[name], b[name], cls, report)
    if ok:
        report.rounding += 1
        report.rounding_identical += int(a == b)


def _compare_claims(ref: Path, new: Path, report: Report) -> None:
    a = {c["id"]: c for c in json.loads(ref.read_text())}
    b = {c["id"]: c for c in json.loads(new.read_text())}
    for cid in sorted(set(a) | set(b)):
        if cid not in a or cid not in b:
            report.failures.append(f"claims.json: claim {cid} present only in the {'reference' if cid in a else 'new run'}")
            continue
        for key in sorted(set(a[cid]) | set(b[cid])):
            cls = claim_class(cid, key)
            x, y = a[cid].get(key), b[cid].get(key)
            if cls == MACHINE:
                report.machine += 1
                continue
            if cls == EXACT or _as_float(x) is None or _as_float(y) is None:
                report.note_exact(x == y, "claim outcome" if key in ("holds", "kind") else EXACT)
                if x != y:
                    report.failures.append(f"claims.json: claim {cid}, field {key}: {x!r} != {y!r}")
                else:
                    report.exact += 1
                continue
            ratio = TOLERANCES[cls].ratio(float(x), float(y))
            report.note_ratio(ratio, f"claims.json:{cid}.{key}", cls)
            if ratio > 1:
                report.failures.append(
                    f"claims.json: claim {cid}, field {key}: {x} vs {y} beyond tolerance {cls!r} (ratio {ratio:.3g})"
                )
            else:
                report.rounding += 1
                report.rounding_identical += int(x == y)


def headline_ratio(mode: str, tolerance: float, x: str, y: str) -> float:
    """|difference| / tolerance of two printed headline numbers (<= 1 passes); exact: 0 or inf."""
    if x == y:
        return 0.0
    if mode == "exact":
        return math.inf
    nx, ny = _NUMBER.findall(_normalise_numbers(x)), _NUMBER.findall(_normalise_numbers(y))
    if len(nx) != 1 or len(ny) != 1 or _NUMBER.sub("#", _normalise_numbers(x)) != _NUMBER.sub("#", _normalise_numbers(y)):
        return math.inf
    a, b = float(nx[0]), float(ny[0])
    if mode == "abs":
        return abs(a - b) / tolerance
    if mode == "rel":
        return abs(a - b) / (tolerance * max(abs(a), abs(b)))
    if a == 0 or b == 0 or (a > 0) != (b > 0):
        return math.inf
    return abs(math.log10(a / b)) / tolerance


def _compare_findings(reference: Path, candidate: Path, report: Report, only: set[str] | None = None) -> set[str]:
    """Each finding's headline numbers within the tolerance the registry declares; returns the
    headline macro names, which the macro comparison then leaves to this one. With `only`, just
    the macros of those files are compared."""

    files = None if only is None else {Path(r).name for r in only if r.startswith("macros/")}
    a, b = read_macros(reference, files), read_macros(candidate, files)
    names = set()
    for f in list_findings():
        for h in f.headlines:
            names.add(h.macro)
            where = f"finding {f.id}: \\{h.macro}"
            if h.macro not in a or h.macro not in b:
                if h.macro in a or h.macro in b:
                    report.failures.append(f"{where} present only in the {'reference' if h.macro in a else 'new run'}")
                    report.note_ratio(math.inf, where, "headline")
                continue
            ratio = headline_ratio(h.mode, h.tolerance, a[h.macro], b[h.macro])
            report.note_ratio(ratio, where, "headline")
            if ratio > 1:
                report.failures.append(f"{where}: {a[h.macro]} vs {b[h.macro]} beyond its {h.mode} tolerance "
                                       f"{h.tolerance:g} ({h.why})" if h.mode != "exact" else
                                       f"{where}: {a[h.macro]!r} != {b[h.macro]!r} (exact)")
    return names


def compare_folders(reference: Path, candidate: Path, only: set[str] | None = None) -> Report:
    """Compare every declared file of `candidate` with `reference` by its output class.

    `only` limits the comparison to those relative paths (a partial results folder, such as
    another machine's data without its figures)."""
    reference, candidate = Path(reference), Path(candidate)
    report = Report()
    headlines = _compare_findings(reference, candidate, report, only)
    ref_files, new_files = set(result_files(reference)), set(result_files(candidate))
    for rel in sorted(ref_files | new_files):
        if only is not None and rel not in only:
            continue
        cls = file_class(rel)
        if cls is None:
            report.failures.append(f"{rel}: undeclared file; add a pattern to keybias.pipeline.outputs.FILES")
            continue
        if cls.cls == MACHINE:
            report.machine += 1
            continue
        if rel not in new_files or rel not in ref_files:
            where = "not regenerated" if rel not in new_files else "new, absent from the reference"
            report.failures.append(f"{rel}: {where}")
            continue
        if rel == "claims.json":
            _compare_claims(reference / rel, candidate / rel, report)
        elif cls.cls == "findings":
            continue  # its numbers are the headlines compared above; its text is the registry's
        elif cls.cls == "columns":
            _compare_csv(rel, reference / rel, candidate / rel, report, reference)
        elif cls.cls == "macros":
            _compare_macros(rel, reference / rel, candidate / rel, report, frozenset(headlines))
        else:
            _compare_text(rel, reference / rel, candidate / rel, cls.tolerance, report, cls.columns)
    return report


def main(argv: list[str] | None = None) -> int:
    """`python -m keybias.pipeline.outputs REFERENCE CANDIDATE`: compare two results folders (the
    candidate may be partial: only the files it holds are compared) and print the class table."""

    parser = argparse.ArgumentParser(prog="python -m keybias.pipeline.outputs", description=main.__doc__)
    parser.add_argument("reference")
    parser.add_argument("candidate")
    args = parser.parse_args(argv)
    only = set(result_files(Path(args.candidate)))
    report = compare_folders(Path(args.reference), Path(args.candidate), only=only)
    for failure in report.failures:
        print(f"DIFFERS {failure}")
    print("\n".join(report.tier_table()))
    print("\n".join(report.class_table()))
    print(report.summary())
    print("PASSED" if report.ok else "FAILED")
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
