"""What the paper and README print about the claims: headline counts, sentences, macros.

`headline_counts` gives the numbers by kind (never summing test claims with the others) and, from
the verdict table of notebook 02, the independent tests per dtype; `headline_macros` and
`write_headline_macros` turn them into `results/macros/claims.tex`; `kind_summary` is the
readers' sentence; `macro_index` traces every macro to the file and notebook that define it; and
`claims_table` is the appendix's table of every claim. The macro names are listed in
`keybias.pipeline.claims`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from keybias.core.recorder import CLAIM_KINDS, atomic_write_text, format_number, latex_escape
from keybias.studies.params import DTYPE_MACRO

VERDICT_TABLE = Path("data") / "invariance.csv"
MEASURED_VERDICTS = ("redundant", "not_redundant")
KIND_TITLES = {
    "test": "Tests: measurements that plausible data could contradict",
    "proof": "Proof checks: exact symbolic identities, checked by SymPy (not empirical tests)",
    "control": "Positive controls: the power of the tests they protect, not findings",
    "consistency": "Consistency checks: bookkeeping cross-checks",
    "implied": "Implied: these follow from the claims they name and are not counted as evidence",
}


def headline_counts(claims: list[dict], verdicts=None) -> dict[str, int]:
    """The numbers the abstract and README may print, keyed by macro name (see module doc).

    `verdicts` (optional) is the invariance table with columns `dtype`, `verdict`, `expected`
    and optionally `status` and a boolean `independent`. Only measured rows with a verdict of
    redundant or not redundant count; an independent one is a test, any other is implied.
    Without an `independent` column every such verdict counts as independent: notebook 02
    judges each one against a rounding null calibrated in its own dtype.
    """
    # no total over kinds: only test claims count as evidence, so they are never summed with the rest
    counts = {
        "ClaimsTest": sum(c.get("kind") == "test" for c in claims),
        "ClaimsTestHolding": sum(c.get("kind") == "test" and bool(c.get("holds")) for c in claims),
        "ClaimsProof": sum(c.get("kind") == "proof" for c in claims),
        "ClaimsControl": sum(c.get("kind") == "control" for c in claims),
        "ClaimsConsistency": sum(c.get("kind") == "consistency" for c in claims),
        "ClaimsImplied": sum(c.get("kind") == "implied" for c in claims),
    }
    if verdicts is None:
        return counts
    missing = [col for col in ("dtype", "verdict", "expected") if col not in verdicts]
    if missing:
        raise ValueError(f"the verdict table lacks column(s) {missing}")
    measured = verdicts[verdicts["verdict"].isin(MEASURED_VERDICTS)]
    if "status" in measured:
        measured = measured[measured["status"] == "measured"]
    if "independent" not in measured:
        # notebook 02 judges every verdict against a rounding null calibrated in its own dtype
        measured = measured.assign(independent=True)
    unknown = sorted(set(measured["dtype"]) - set(DTYPE_MACRO))
    if unknown:
        raise ValueError(f"no macro name for dtype(s) {unknown}; add them to DTYPE_MACRO")
    independent = measured["independent"].astype(bool)
    for dtype, name in DTYPE_MACRO.items():
        rows = measured["dtype"] == dtype
        tests = rows & independent
        counts[f"IndepTests{name}"] = int(tests.sum())
        counts[f"IndepContradictions{name}"] = int((tests & (measured["verdict"] != measured["expected"])).sum())
        counts[f"ImpliedVerdicts{name}"] = int((rows & ~independent).sum())
    counts["IndepTestsTotal"] = sum(counts[f"IndepTests{n}"] for n in DTYPE_MACRO.values())
    counts["IndepContradictionsTotal"] = sum(counts[f"IndepContradictions{n}"] for n in DTYPE_MACRO.values())
    return counts


KIND_NOUNS = {  # singular, plural: how a sentence names claims of each kind
    "test": ("test claim", "test claims"),
    "proof": ("proof check", "proof checks"),
    "control": ("positive control", "positive controls"),
    "consistency": ("consistency check", "consistency checks"),
    "implied": ("implied claim", "implied claims"),
}


def _count_noun(n: int, kind: str) -> str:
    one, many = KIND_NOUNS[kind]
    return f"one {one}" if n == 1 else f"{n} {many}"


def kind_summary(claims: list[dict]) -> str:
    """One or two sentences for readers: how the test claims fared, then the other kinds apart
    (never summed with the tests). No degenerate counts: "all 12 hold", "the one ... holds"."""
    by_kind = {k: [c for c in claims if c.get("kind") == k] for k in CLAIM_KINDS}
    tests = by_kind["test"]
    held = sum(bool(c.get("holds")) for c in tests)
    if not tests:
        first = "The run makes no test claims."
    elif len(tests) == 1:
        first = f"The one test claim {'holds' if held else 'fails'}."
    elif held == len(tests):
        first = f"All {len(tests)} test claims hold."
    elif held == 0:
        first = f"None of the {len(tests)} test claims holds."
    else:
        first = f"{held} of {len(tests)} test claims hold; {len(tests) - held} fail."
    others = [(k, by_kind[k]) for k in ("proof", "control", "consistency", "implied") if by_kind[k]]
    if not others:
        return first
    parts = [_count_noun(len(group), k) for k, group in others]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    failing = sum(not c.get("holds") for _, group in others for c in group)
    if sum(len(group) for _, group in others) == 1:
        tail = "it fails" if failing else "it holds"
    elif failing == 0:
        tail = "all of them hold"
    elif failing == 1:
        tail = "one of them fails"
    else:
        tail = f"{failing} of them fail"
    return f"{first} Not counted as evidence: {listed}; {tail}."


def headline_macros(counts: dict[str, int], mutation_covered: int | None = None) -> str:
    lines = ["% generated by keybias.pipeline.claims.headline_macros: counts of claims by kind and of independent tests"]
    values = dict(counts)
    if mutation_covered is not None:
        values["ClaimsMutationCovered"] = mutation_covered
    lines += [f"\\newcommand{{\\{k}}}{{{format_number(int(v))}}}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def write_headline_macros(results: Path, claims: list[dict]) -> Path:
    """Write `results/macros/claims.tex` from the claims and, if present, the verdict table."""
    verdicts = None
    table = Path(results) / VERDICT_TABLE
    if table.exists():
        verdicts = pd.read_csv(table)
    path = Path(results) / "macros" / "claims.tex"
    text = headline_macros(headline_counts(claims, verdicts))
    if not path.exists() or path.read_text() != text:
        atomic_write_text(path, text)
    return path


# -- macro index ------------------------------------------------------------------------------
MACRO_DEFINITION = re.compile(r"\\newcommand\{\\([A-Za-z]+)\}")
# macro files the build writes itself, and who writes them
BUILD_MACRO_FILES = {
    "provenance": "keybias.pipeline.paper.provenance_macros",
    "claims": "keybias.pipeline.claims.headline_macros",
}


def macro_index(results: Path) -> dict[str, dict[str, str]]:
    """{macro name: {"file": "macros/<f>.tex", "source": notebook or build function}} for every
    macro defined under `results/macros` (all.tex only inputs the others). A name defined in two
    files is an error naming both."""
    index: dict[str, dict[str, str]] = {}
    for path in sorted((Path(results) / "macros").glob("*.tex")):
        if path.stem == "all":
            continue
        source = BUILD_MACRO_FILES.get(path.stem, f"notebooks/{path.stem}.ipynb")
        for name in MACRO_DEFINITION.findall(path.read_text()):
            if name in index:
                raise ValueError(f"macro \\{name} is defined in {index[name]['file']} and in macros/{path.name}")
            index[name] = {"file": f"macros/{path.name}", "source": source}
    return dict(sorted(index.items()))


def write_macro_index(results: Path) -> Path:
    """Write `results/macros/index.json`: each macro the paper may use, with the file and the
    notebook (or build function) that defines it, so a name seen in paper/ can be traced."""
    path = Path(results) / "macros" / "index.json"
    text = json.dumps(macro_index(results), indent=1) + "\n"
    if not path.exists() or path.read_text() != text:
        atomic_write_text(path, text)
    return path


# -- appendix table ---------------------------------------------------------------------------
def _tt_id(cid: str) -> str:
    return r"\texttt{\footnotesize " + cid.replace("_", r"\_").replace("-", "-{}\\allowbreak{}") + "}"


def claims_table(claims: list[dict]) -> str:
    """A longtable of every claim, grouped by kind: id, statement with bound origin, check."""
    symbols = {"<=": r"\le", "<": "<", ">=": r"\ge", ">": ">", "==": "="}
    rows = [
        r"\begin{longtable}{>{\raggedright\arraybackslash}p{0.25\linewidth}>{\raggedright\arraybackslash}p{0.47\linewidth}r}",
        r"\toprule claim & statement; origin of the bound & check \\ \midrule \endhead",
    ]
    kinds = [*CLAIM_KINDS, *sorted({c.get("kind") or "none" for c in claims} - set(CLAIM_KINDS))]
    for kind in kinds:
        group = [c for c in claims if (c.get("kind") or "none") == kind]
        if not group:
            continue
        title = KIND_TITLES.get(kind, f"kind {kind}")
        rows.append(rf"\multicolumn{{3}}{{l}}{{\textbf{{{latex_escape(title)}}} ({len(group)})}} \\ \midrule")
        for c in group:
            check = (
                f"${format_number(c['value'])} {symbols[c.get('comparison', '<=')]} "
                f"{format_number(c['bound'])}$ {'holds' if c['holds'] else 'FAILS'}"
            )
            detail = latex_escape(c["statement"])
            if c.get("bound_origin"):
                detail += r" \emph{Bound: " + latex_escape(c["bound_origin"]) + ".}"
            if c.get("identity"):
                detail += r" \emph{Identity: " + latex_escape(c["identity"]) + ".}"
            if c.get("min_detectable") is not None:
                detail += r" \emph{Smallest detectable effect: $" + format_number(c["min_detectable"]) + "$.}"
            if c.get("implied_by"):
                detail += r" \emph{Implied by} " + ", ".join(_tt_id(i) for i in c["implied_by"]) + "."
            rows.append(rf"{_tt_id(c['id'])} & \footnotesize {detail} & \footnotesize {check} \\")
        rows.append(r"\midrule")
    rows[-1] = r"\bottomrule"
    rows.append(r"\end{longtable}")
    return "\n".join(rows) + "\n"
