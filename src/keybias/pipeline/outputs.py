"""The comparison engine of `make verify`: two results folders compared by output class.

What each file, data column, macro and claim field is, and how closely it must agree, is declared
in `keybias.pipeline.output_classes` (tolerances, whole-file classes, the studies' columns) and
`keybias.pipeline.macro_classes` (the studies' macro names); this module re-exports those names.
`compare_folders` is the comparison of `make verify`; `python -m keybias.pipeline.outputs
REFERENCE CANDIDATE` compares two folders and prints the table per class.
tests/pipeline/test_verify.py plants a wrong value for each class.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from keybias.pipeline.findings_out import macro_definitions, read_macros
from keybias.pipeline.macro_classes import UndeclaredMacro, declared_macros, macro_class  # noqa: F401
from keybias.pipeline.output_classes import (  # noqa: F401  (re-exported: the declarations)
    CLAIM_FIELDS,
    DATA_COLUMNS,
    EXACT,
    FILES,
    MACHINE,
    STATISTICAL,
    STATISTICS,
    STUDIES,
    THRESHOLD_COLUMNS,
    THRESHOLD_MIN,
    THRESHOLD_SLACK,
    TIER_EXACT,
    TIER_FINDINGS,
    TIER_STATS,
    TOLERANCES,
    UNIT_ROUNDOFF,
    FileClass,
    Tolerance,
    claim_class,
    claim_specs,
    file_class,
    file_class_is_machine,
    result_files,
    tier_of,
    undeclared,
)
from keybias.studies.findings import list_findings

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
    """Each macro by its declared class (`macro_class`): exact text, or numbers within the class
    of the data it prints; machine macros are not compared, and findings' headlines are compared by
    `_compare_findings` with their own tolerances."""
    a, b = _macros(ref.read_text()), _macros(new.read_text())
    ok = True
    for name in sorted(set(a) | set(b)):
        if name in headlines and name in a and name in b:
            continue
        try:
            cls = macro_class(rel, name)
        except UndeclaredMacro as error:
            ok = False
            report.failures.append(str(error))
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
