"""The NaN policy of the judges (`keybias.core.reduce`), enforced on every judge entry point.

Each entry point the notebooks call (`judge_calls.CALLS`) runs on a valid small input built from
the committed tables. Then, for each column of its inputs that the study's schema declares
(`src/keybias/studies/*/schema.py`, through `keybias.studies.columns`; a recorded or machine table
without a schema contributes its own columns):

* **a missing column stops the judge** (policy 4): with the column dropped the judge raises, or
  returns exactly what it returned before (it does not read that column); it never returns
  something else silently, as a `"name" in frame` guard that lets every row pass would;
* **a NaN never passes silently** (policies 1 and 2): with one entry of a numeric column the judge
  reads set to NaN (the entry at the column's largest finite value, and at its smallest) the judge
  raises, or records the exclusion with a claim, or returns exactly what it returned before (it does
  not read that entry); it never returns another verdict, macro or table without saying why.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import judge_calls as J  # noqa: E402

import keybias.studies  # noqa: E402

# a recorded table whose file name differs from the table notebook 02 writes with the same columns
RECORDED_AS = {"invariance_configs": "invariance", "memory_allocator": "cost_memory_allocator"}


@cache
def declared() -> dict[str, dict[str, str]]:
    """Every study's declared tables: "data/<name>.csv" -> {column: output class}."""
    out: dict[str, dict[str, str]] = {}
    for info in pkgutil.iter_modules(keybias.studies.__path__):
        try:
            schema = importlib.import_module(f"keybias.studies.{info.name}.schema")
        except ModuleNotFoundError:
            continue
        out.update(schema.TABLES)
    return out


def columns_of(path: str) -> list[str]:
    """The declared columns of the table at `path` (its schema's), or, for a recorded or machine
    table without a schema of its own, the table's columns."""
    stem = Path(path).stem.removeprefix("longrun_full_")
    frame = J.table(path)
    schema = declared().get(f"data/{RECORDED_AS.get(stem, stem)}.csv")
    if schema is None:
        return list(frame.columns)
    return [c for c in schema if c in frame.columns]


def _numeric(series: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series)


# ----------------------------------------------------------------------------- small inputs
def _small_invariance(df: pd.DataFrame, mags: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One configuration per kind of row (family, case, option, variant, dtype, status and verdicts),
    and of the power-control rows one per group of the power table (dtype and size) that saw a break
    and one that saw none: a valid sweep a fraction of the size. (Every power-control row made each
    of the many runs of the judge here cost seconds; the table keeps one row per group all the same.)"""
    from keybias.studies.invariance.judge import SIZE_COLUMNS

    kinds = ["family", "case", "option", "variant", "dtype", "status", "verdict", "verdict_float64", "expected",
             "grad_verdict", "drop_verdict"]
    power = df["min_detectable_eps"].notna() | df["power_tolerance_rel"].notna() | df["power_probe_states"].notna()
    group = df.assign(undetected=df["min_detectable_eps"].isna())[["dtype", *SIZE_COLUMNS, "undetected"]]
    keep = df[(power & ~group.duplicated()) | ~df.duplicated(kinds)]
    return keep.reset_index(drop=True), mags[mags["config_id"].isin(keep["config_id"])].reset_index(drop=True)


SMALL = {
    "invariance.all": (("df", "mags"), _small_invariance),
    "gpu.invariance": (("rows", "mags"), _small_invariance),
}


@cache
def inputs(name: str) -> dict[str, pd.DataFrame]:
    spec, _ = J.calls()[name]
    tables = {arg: J.table(path) for arg, path in spec.items()}
    if name in SMALL:
        args, shrink = SMALL[name]
        tables.update(zip(args, shrink(*(tables[a] for a in args)), strict=True))
    return tables


def _verdicts(out) -> list:
    """What a judge decides and prints: its claims (records) and its macros (dicts of scalars). The
    tables it returns are left out: several carry their input's columns through for display."""
    found = []

    def walk(o):
        if isinstance(o, (list, tuple)):
            if len(o) == 2 and o[0] == "Claim":
                found.append(o)
                return
            if o and o[0] in ("DataFrame", "Series"):
                return
            for v in o:
                walk(v)
        elif isinstance(o, dict):
            scalars = {k: v for k, v in o.items() if not isinstance(v, (list, tuple, dict))}
            if scalars:
                found.append(scalars)
            for v in o.values():
                if isinstance(v, (list, tuple, dict)):
                    walk(v)
        elif isinstance(o, str):
            found.append(o)  # a sentence a judge writes (findings_text)

    walk(out)
    return found


def _run(name: str, tables: dict[str, pd.DataFrame]):
    return _verdicts(J.canonical(J.run(name, {k: v.copy() for k, v in tables.items()})))


@cache
def baseline(name: str):
    return _run(name, inputs(name))


# a macro that counts what a judge left out, and why (e.g. GpuPowerUndetected, PrecOutputExcludedCount)
EXCLUSION_MACRO = re.compile(r"Excluded|Undetected|LeftOut|Blind")


def _exclusions(out) -> list:
    """Every claim's recorded exclusions, and every macro that counts exclusions, in a judge's output."""
    found = []

    def walk(o):
        if isinstance(o, (list, tuple)):
            if len(o) == 2 and o[0] == "Claim":
                found.append((o[1]["id"], tuple(o[1].get("exclusions") or ())))
                return
            for v in o:
                walk(v)
        elif isinstance(o, dict):
            found.extend((k, v) for k, v in o.items() if EXCLUSION_MACRO.search(str(k)))
            for v in o.values():
                walk(v)

    walk(out)
    return found


def _outcome(name: str, tables: dict[str, pd.DataFrame]) -> str:
    """'raised', 'same' or 'recorded' (an exclusion added to a claim), else 'silent'."""
    try:
        out = _run(name, tables)
    except (ValueError, KeyError) as exc:  # NonFiniteValues, EmptySelection and missing columns included
        assert str(exc), "the error must say what is wrong"
        return "raised"
    if out == baseline(name):
        return "same"
    if _exclusions(out) != _exclusions(baseline(name)):
        return "recorded"
    return "silent"


def _cases():
    for name, (spec, _) in J.calls().items():
        for arg, path in spec.items():
            for column in columns_of(path):
                yield name, arg, column


CASES = list(_cases())


def _id(case) -> str:
    return "-".join(case)


def _missing(case) -> dict[str, pd.DataFrame] | str:
    """The inputs of `case` with its column dropped, or why the case does not apply."""
    name, arg, column = case
    tables = dict(inputs(name))
    if column not in tables[arg].columns:
        return f"{column} is not in the small input"
    tables[arg] = tables[arg].drop(columns=[column])
    return tables


def _nans(case) -> dict[int, dict[str, pd.DataFrame]] | str:
    """{row: the inputs of `case` with its column NaN in that row} for the rows of the column's
    largest and smallest finite value, or why the case does not apply."""
    name, arg, column = case
    frame = inputs(name)[arg]
    if column not in frame.columns or not _numeric(frame[column]):
        return f"{column} is not a numeric column of the small input"
    values = pd.to_numeric(frame[column], errors="coerce").astype(float)
    finite = values[np.isfinite(values)]
    if finite.empty:
        return f"{column} holds no finite entry to replace"
    out = {}
    for row in dict.fromkeys([finite.idxmax(), finite.idxmin()]):
        tables = dict(inputs(name))
        doctored = tables[arg].copy()
        doctored[column] = doctored[column].astype(float if not pd.api.types.is_bool_dtype(doctored[column])
                                                   else object)
        doctored.loc[row, column] = np.nan
        tables[arg] = doctored
        out[int(row)] = tables
    return out


def _key(*parts) -> str:
    return "|".join(map(str, parts))


TESTS = {"missing": "test_a_missing_column_stops_the_judge", "nan": "test_a_nan_never_passes_silently"}


def all_outcomes(selected: set[str] | None = None) -> dict[str, str]:
    """The outcome of every case of both tests ("missing|<case>", "nan|<case>|<row>"), or of those
    `selected` names ("<test>[<case id>]"); an error that is not the judge's refusal is kept as
    "error: ..." for the test to fail with."""
    import traceback

    out = {}
    for case in CASES:
        for kind, make in (("missing", _missing), ("nan", _nans)):
            if selected is not None and f"{TESTS[kind]}[{_id(case)}]" not in selected:
                continue
            made = make(case)
            if isinstance(made, str):
                continue
            for row, tables in ([(None, made)] if kind == "missing" else made.items()):
                key = _key(kind, *case) if row is None else _key(kind, *case, row)
                try:
                    out[key] = _outcome(case[0], tables)
                except Exception:  # reported by the test that owns the case
                    out[key] = "error: " + traceback.format_exc(limit=8)
    return out


# The judges' runs here cost minutes. In a session that runs other tests too, conftest starts this
# file as a script at the end of collection, in a process of its own, to compute every outcome while
# the other tests run (make test has two cores and runs one test at a time); a test then reads its
# case's outcome from there. Each outcome is computed by the same code on the same inputs as inline.
@cache
def _background() -> dict[str, str]:
    import conftest

    job = conftest.BACKGROUND.get("nan_policy")
    if job is None:
        return {}
    import subprocess

    proc, path = job
    try:
        code = proc.wait(timeout=1800)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = None
    if code != 0 or not path.exists():
        return {}  # then every outcome is computed here, as without the background process
    import json

    return json.loads(path.read_text())


def outcome_of(kind: str, case, row, tables) -> str:
    key = _key(kind, *case) if row is None else _key(kind, *case, row)
    found = _background().get(key)
    if found is None:
        return _outcome(case[0], tables)
    assert not found.startswith("error: "), found
    return found


def test_every_entry_point_runs_on_its_small_input():
    for name in J.calls():
        assert baseline(name) is not None


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_a_missing_column_stops_the_judge(case):
    name, arg, column = case
    tables = _missing(case)
    if isinstance(tables, str):
        pytest.skip(tables)
    outcome = outcome_of("missing", case, None, tables)
    assert outcome in ("raised", "same"), (
        f"{name} without {arg}.{column} returned other results instead of raising: a guard that fails open")


@pytest.mark.parametrize("case", [c for c in CASES], ids=_id)
def test_a_nan_never_passes_silently(case):
    name, arg, column = case
    doctored = _nans(case)
    if isinstance(doctored, str):
        pytest.skip(doctored)
    for row, tables in doctored.items():
        outcome = outcome_of("nan", case, row, tables)
        assert outcome != "silent", (
            f"{name} with {arg}.{column} NaN in row {row} returned other results without raising or "
            "recording the exclusion")


if __name__ == "__main__":
    # python tests/studies/test_nan_policy.py OUT.json [SELECTED.json]: the outcomes (conftest starts this)
    import json

    target = Path(sys.argv[1])
    selected = set(json.loads(Path(sys.argv[2]).read_text())) if len(sys.argv) > 2 else None
    scratch = target.with_suffix(".partial")
    scratch.write_text(json.dumps(all_outcomes(selected)))
    scratch.replace(target)  # complete or absent: a killed run leaves no half-written file
