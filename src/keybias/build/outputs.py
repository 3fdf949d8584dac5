"""Output classes: what `make verify` compares, and how closely.

Every results file, and every column of every `data/*.csv`, is one of three classes:

- **exact**: byte-equal on any machine (configurations, counts, verdicts, symbolic results,
  claim outcomes);
- **rounding**: equal within a tolerance the column declares (`TOLERANCES`), chosen from the
  column's dtype and computation before comparing anything, never tuned to pass;
- **machine**: timings, thread counts, CPU names, rendered pages: never compared.

`DATA_COLUMNS` declares each data column; `FILES` declares whole files by pattern. A column or
file that is not declared fails `undeclared()` (a test runs it on a smoke run), and the message
names the exact line to add. `compare_folders` is the comparison of `make verify`.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from keybias.studies.columns import cols

EXACT = "exact"
MACHINE = "machine"

# Unit roundoff per dtype (half the machine epsilon): the floor below which a measured
# rounding error is indistinguishable from zero.
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


@dataclass(frozen=True)
class Tolerance:
    """How far two values of a rounding column may lie apart.

    Values agree when |a - b| <= atol + rtol * max(|a|, |b|); with `decades` set, when both
    are below `floor_u` unit roundoffs of the row's dtype (or of `floor_dtype`), or their
    ratio is within 10**decades. Both NaN agree; one NaN does not.
    """

    why: str
    rtol: float = 0.0
    atol: float = 0.0
    decades: float | None = None
    floor_u: float = 2.0
    floor_dtype: str | None = None
    scale_column: str | None = None  # adds scale_factor * |reference row's scale_column| to atol
    scale_factor: float = 0.0

    def ratio(self, a: float, b: float, dtype: str = "float64", scale: float = 0.0) -> float:
        """|difference| / tolerance: <= 1 passes; the largest is reported by verify.

        With `decades` and an absolute or relative limit both set, either one passing suffices.
        """
        if math.isnan(a) or math.isnan(b):
            return 0.0 if math.isnan(a) and math.isnan(b) else math.inf
        if math.isinf(a) or math.isinf(b):
            return 0.0 if a == b else math.inf
        if self.decades is not None and (self.atol or self.rtol or self.scale_factor):
            return min(self._decade_ratio(a, b, dtype), self._linear_ratio(a, b, scale))
        if self.decades is not None:
            return self._decade_ratio(a, b, dtype)
        return self._linear_ratio(a, b, scale)

    def _decade_ratio(self, a: float, b: float, dtype: str) -> float:
        floor = self.floor_u * UNIT_ROUNDOFF.get(self.floor_dtype or dtype, UNIT_ROUNDOFF["float64"])
        if abs(a) <= floor and abs(b) <= floor:
            return 0.0
        if a == 0 or b == 0 or (a > 0) != (b > 0):
            return math.inf
        return abs(math.log10(abs(a) / abs(b))) / self.decades

    def _linear_ratio(self, a: float, b: float, scale: float) -> float:
        limit = self.atol + self.rtol * max(abs(a), abs(b))
        if self.scale_factor and math.isfinite(scale):
            limit += self.scale_factor * abs(scale)
        if a == b:
            return 0.0
        return abs(a - b) / limit if limit > 0 else math.inf


TOLERANCES = {
    "f64": Tolerance(
        rtol=1e-9,
        why="a float64 value from sums of up to ~1e6 terms; another summation order moves it "
        "by about n*u64 ~ 1e-10 relative",
    ),
    "f32": Tolerance(
        rtol=1e-4, atol=1e-12,
        why="a float32 value from sums of up to ~1e3 terms; another kernel moves it by about "
        "n*u32 ~ 1e-4 relative",
    ),
    "f32_diff": Tolerance(
        rtol=1e-4, atol=16 * 2.0**-24,
        why="a difference of two float32 outputs divided by the output scale: its error is "
        "absolute, a few u32 from the two sums (16u = 9.5e-7)",
    ),
    "noise": Tolerance(
        decades=1.0,
        why="a measured rounding error, or a quantity computed from one (a measured tolerance, "
        "a ratio to it): another kernel reproduces its size, not its bits; sizes agree within "
        "one decade, and below one ulp (2u) of the row's dtype it is zero",
    ),
    "noise32": Tolerance(
        decades=1.0, floor_dtype="float32",
        why="as 'noise', for float32 computations in a table without a dtype column: below one "
        "float32 ulp (2u = 1.2e-7 relative) it is zero",
    ),
    "noise_stat": Tolerance(
        atol=0.25,
        why="a statistic of directions of pure rounding noise (mean cosine, consistency of unit "
        "vectors): it is itself noise of size ~1/sqrt(batches) ~ 0.3 and changes sign between "
        "kernels; the check only catches a switch to a systematic direction (values near 1)",
    ),
    "printed": Tolerance(
        decades=1.0, floor_dtype="float32",
        why="a number printed to 3 digits from the compared data columns (which carry the strict "
        "check): its order of magnitude and sign must agree; below one float32 ulp it is zero",
    ),
    "fit": Tolerance(
        rtol=0.1, atol=0.05,
        why="a fit or statistic over measured rounding errors: new noise moves it by a few of "
        "its standard errors (slope_se ~0.004-0.05 in the committed run)",
    ),
    "chaotic": Tolerance(
        decades=1.0, floor_dtype="float32", atol=0.01,
        why="a value of float32 training after rounding noise made two runs diverge (per-step "
        "losses and norms, b_k under Adam, whose gradient is pure noise): reproducible in size "
        "(one decade), accuracies to a few test samples (0.01 = 3.6 of 359)",
    ),
    "vs_loss_control": Tolerance(
        decades=1.0, floor_dtype="float32", scale_column="max_loss_rel_diff_control", scale_factor=2.0,
        why="kept vs removed b_k differ only by rounding noise, like the noise-level control; "
        "another machine's noise moves the difference by up to twice the control's size",
    ),
    "vs_divergence_control": Tolerance(
        decades=1.0, floor_dtype="float32", scale_column="final_divergence_control", scale_factor=2.0,
        why="as vs_loss_control, for the final parameter divergence",
    ),
    "vs_param_control": Tolerance(
        decades=1.0, floor_dtype="float32", scale_column="param_divergence_control", scale_factor=2.0,
        why="as vs_loss_control, for the parameter divergence per step",
    ),
    "walk": Tolerance(
        rtol=0.5, atol=1e-12,
        why="a long training run's random walk (b_k under Adam is driven by rounding noise): another "
        "CPU draws another sample of the walk; per-layer norms vary by ~1/sqrt(2n) ~ 10%, doubled "
        "and more for chaotic divergence of the run itself",
    ),
    "log2_walk": Tolerance(
        atol=0.6,
        why="a log2 ratio of two random-walk sizes: 'walk' (50%) in log2 units is ~0.6",
    ),
    "images": Tolerance(
        atol=5.0,
        why="a count of test images on which two float32 runs disagree: rounding noise flips a few",
    ),
    "chaotic_printed": Tolerance(
        decades=1.0, floor_dtype="float32", atol=0.5,
        why="numbers printed from float32 training outcomes, z statistics of null effects "
        "included, which move by a fraction of one between noise realisations",
    ),
}


STUDIES = ("symbolic", "invariance", "precision", "training", "pretrained", "cost", "conditions", "longrun")


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


# Whole files by pattern, first match wins. data/*.csv are compared per column instead.
FILES: list[tuple[str, FileClass]] = [
    ("machine/*", FileClass(MACHINE, "wall times and thread counts (Recorder.machine_csv)")),
    ("provenance.json", FileClass(MACHINE, "commit, versions, CPU, wall times of this run")),
    ("data/cost_timing*.csv", FileClass(MACHINE, "timings: never compared (notebook 06 writes them under machine/)")),
    ("tables/cost_timing*.tex", FileClass(MACHINE, "tables of timings")),
    ("macros/provenance.tex", FileClass(MACHINE, "provenance printed in the paper")),
    ("steps/*.json", FileClass(MACHINE, "per-notebook provenance; its claims are compared in claims.json")),
    ("notebooks/*", FileClass(MACHINE, "executed notebooks and their pages: outputs carry timings")),
    ("figures/*", FileClass(MACHINE, "drawn from the compared data columns; font rasterising is machine-specific")),
    ("index.html", FileClass(MACHINE, "entry page generated from claims and provenance")),
    ("equations/*", FileClass(EXACT, "SymPy output: exact rational arithmetic")),
    ("claims.json", FileClass(EXACT, "compared claim by claim, see CLAIM_FIELDS")),
    ("tables/claims.tex", FileClass("rounding", "claim values printed to 3 digits", "printed")),
    ("macros/all.tex", FileClass(EXACT, "the list of macro files and the claim count")),
    ("macros/*_machine.tex", FileClass(MACHINE, "timings and load of this machine (Recorder.machine_macro)")),
    ("macros/04_training.tex", FileClass("rounding", "printed float32 training outcomes", "chaotic_printed")),
    ("tables/training_*.tex", FileClass("rounding", "printed float32 training outcomes", "chaotic_printed")),
    ("tables/precision_gradient.tex", FileClass("rounding", "prints noise statistics (bk_mean_cos)", "noise_stat")),
    ("macros/*", FileClass("rounding", "numbers printed to 3 digits; text exact", "printed")),
    ("tables/*", FileClass("rounding", "numbers printed to 3 digits; text exact", "printed")),
    ("data/*.csv", FileClass("columns", "compared per column, see DATA_COLUMNS")),
]

# Claim record fields: outcome and identity exact; measured numbers within noise.
CLAIM_FIELDS = cols(
    exact="id statement comparison holds notebook device profile kind implied_by bound_origin",
    noise="value bound min_detectable",
)


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
    import pandas as pd

    missing = []
    for rel in result_files(folder):
        cls = file_class(rel)
        if cls is None:
            missing.append(f"{rel}: add a pattern to keybias.build.outputs.FILES")
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
class Report:
    """The outcome of comparing a candidate results folder with a reference."""

    exact: int = 0
    rounding: int = 0
    rounding_identical: int = 0  # rounding items that came out byte-identical all the same
    machine: int = 0
    worst_ratio: float = 0.0
    worst_where: str = ""
    failures: list[str] = field(default_factory=list)

    def note_ratio(self, ratio: float, where: str) -> None:
        """Keep the largest ratio among values within tolerance (failures are listed apart)."""
        if ratio <= 1 and (ratio > self.worst_ratio or not self.worst_where):
            self.worst_ratio, self.worst_where = ratio, where

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


_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def _row_dtype(row: dict) -> str:
    for key in ("dtype", "working_dtype"):
        if isinstance(row.get(key), str) and row[key] in UNIT_ROUNDOFF:
            return row[key]
    return "float64"


def _as_float(value) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _compare_csv(rel: str, ref: Path, new: Path, report: Report) -> None:
    import pandas as pd

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
    for col in a.columns:
        cls = declared.get(col)
        if cls is None:
            report.failures.append(f"{rel}: column {col!r} is not declared in keybias.build.outputs.DATA_COLUMNS")
            continue
        if cls == MACHINE:
            report.machine += 1
            continue
        bad = 0
        for i, (x, y) in enumerate(zip(a[col], b[col], strict=True)):
            if cls == EXACT:
                if x != y:
                    bad += 1
                    report.failures.append(f"{rel}: column {col}, row {i}: {x!r} != {y!r} (exact)")
                continue
            fx, fy = _as_float(x if x != "" else "nan"), _as_float(y if y != "" else "nan")
            if fx is None or fy is None:
                if x != y:
                    bad += 1
                    report.failures.append(f"{rel}: column {col}, row {i}: {x!r} != {y!r} (not numbers)")
                continue
            tol = TOLERANCES[cls]
            scale = _as_float(rows_a[i].get(tol.scale_column) or "nan") if tol.scale_column else 0.0
            ratio = tol.ratio(fx, fy, _row_dtype(rows_a[i]), scale if scale is not None else math.nan)
            report.note_ratio(ratio, f"{rel}:{col} row {i}")
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


def _normalise_numbers(text: str) -> str:
    """`3.3\\times10^{-15}` -> `3.3e-15` and `2{,}284` -> `2284`, so each number is one token."""
    text = re.sub(r"(\d)\{,\}(\d)", r"\1\2", text)
    return re.sub(r"(\d(?:\.\d*)?)\s*\\times\s*10\^\{?([-+]?\d+)\}?", r"\1e\2", text)


def _compare_text(rel: str, ref: Path, new: Path, tolerance: str | None, report: Report) -> None:
    a, b = ref.read_text(), new.read_text()
    if tolerance is not None:
        a, b = _normalise_numbers(a), _normalise_numbers(b)
    if tolerance is None:
        if a == b:
            report.exact += 1
        else:
            report.failures.append(f"{rel}: differs (exact file)")
        return
    if _NUMBER.sub("#", a) != _NUMBER.sub("#", b):
        report.failures.append(f"{rel}: text outside numbers differs")
        return
    ok = True
    lines_a = a.splitlines()
    for (m, n) in zip(_NUMBER.finditer(a), _NUMBER.finditer(b), strict=True):
        ratio = TOLERANCES[tolerance].ratio(float(m.group()), float(n.group()))
        line = a.count("\n", 0, m.start())
        report.note_ratio(ratio, f"{rel} line {line + 1}")
        if ratio > 1:
            ok = False
            report.failures.append(
                f"{rel}: line {line + 1} ({lines_a[line].strip()[:60]}): {m.group()} vs {n.group()} "
                f"beyond tolerance {tolerance!r} (ratio {ratio:.3g})"
            )
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
            cls = CLAIM_FIELDS.get(key, EXACT)
            x, y = a[cid].get(key), b[cid].get(key)
            if cls == EXACT or _as_float(x) is None or _as_float(y) is None:
                if x != y:
                    report.failures.append(f"claims.json: claim {cid}, field {key}: {x!r} != {y!r}")
                else:
                    report.exact += 1
                continue
            ratio = TOLERANCES[cls].ratio(float(x), float(y))
            report.note_ratio(ratio, f"claims.json:{cid}.{key}")
            if ratio > 1:
                report.failures.append(
                    f"claims.json: claim {cid}, field {key}: {x} vs {y} beyond tolerance {cls!r} (ratio {ratio:.3g})"
                )
            else:
                report.rounding += 1
                report.rounding_identical += int(x == y)


def compare_folders(reference: Path, candidate: Path) -> Report:
    """Compare every declared file of `candidate` with `reference` by its output class."""
    reference, candidate = Path(reference), Path(candidate)
    report = Report()
    ref_files, new_files = set(result_files(reference)), set(result_files(candidate))
    for rel in sorted(ref_files | new_files):
        cls = file_class(rel)
        if cls is None:
            report.failures.append(f"{rel}: undeclared file; add a pattern to keybias.build.outputs.FILES")
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
        elif cls.cls == "columns":
            _compare_csv(rel, reference / rel, candidate / rel, report)
        else:
            _compare_text(rel, reference / rel, candidate / rel, cls.tolerance, report)
    return report
