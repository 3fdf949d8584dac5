"""Output classes: what `make verify` compares, and how closely (the declarations).

Every results file, every column of every `data/*.csv`, every macro and every claim field is
one of three classes:

- **exact**: byte-equal on any machine (configurations, counts, verdicts, symbolic results,
  claim outcomes: a claim's `holds` is never a machine value);
- **rounding**: equal within a tolerance (`TOLERANCES`), each derived from the spread measured
  between machines and instruction sets (the committed Intel AVX-512 run against a real AMD
  AVX2-only run, and a run natively against one capped at AVX2): at most about 3x that spread,
  never looser than the effect the value reports. Each tolerance records its `spread` and `why`;
- **machine**: timings, thread counts, CPU names, rendered pages: never compared.

Data columns are declared in each study's `schema.py` (`DATA_COLUMNS`), macros by name there too
(`MACROS`, expanded and looked up exactly by `keybias.pipeline.macro_classes`), claim values and
bounds by each claim's spec (`keybias.core.claimspec.ClaimSpec`), whole files in `FILES`.
A printed number takes the class of the data it prints, plus the rounding of its own printing.
A column or file that is not declared fails `undeclared()` (a test runs it on a smoke run), and
the message names the exact line to add. The comparison engine that applies these classes is
`keybias.pipeline.outputs` (`compare_folders`, the comparison of `make verify`).
"""

from __future__ import annotations

import fnmatch
import importlib
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from keybias.core.claimspec import list_specs, spec_of
from keybias.studies import SCHEMA_STUDIES
from keybias.studies import claims as study_claims
from keybias.studies.columns import cols

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
STUDIES = SCHEMA_STUDIES


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
    ("macros/*", FileClass("macros", "compared macro by macro, see keybias.pipeline.macro_classes")),
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
