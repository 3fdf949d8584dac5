"""The claim contract: kinds, the committed manifest, the mutation register and headline counts.

A claim is evidence only if it could have failed. The pipeline hands every gathered claim to
`contract_errors`; a non-empty answer stops the build before the paper, naming each claim.

Conventions every notebook follows (design.md, "Claims"):

* **Kinds.** A judge returns `Claim`s (`keybias.core.recorder.Claim`; dicts with the same
  keywords still work) and the notebook hands them to `rec.claims_from`. `kind` is one of
    - `test`: a measurement that plausible data could contradict;
    - `proof`: an exact symbolic identity checked by SymPy; it names the identity in `identity`
      and is a proof check, not an empirical test (no mutation test is required);
    - `consistency`: a bookkeeping cross-check (formula counts equal module counts, ...), or a
      measurement whose outcome the code itself guarantees;
    - `implied`: follows from the claims named in `implied_by=[ids]`, which must exist in the
      same run.
  A check that holds by construction is a unit test, not a claim.
* **Bound origin.** Every claim says in `bound_origin` (one phrase) where its bound comes from:
  theory, a held-out calibration (other seeds, dtypes or sizes), or the issue. A bound is never
  fitted on the runs it judges. A "no effect" claim also gives `min_detectable`, the smallest
  effect its size-matched positive control shows it would have seen.
* **Judge functions** are pure: DataFrames in, a list of `Claim`s out, so that a test can hand
  them doctored data.
* **Finite reductions** (`keybias.core.reduce`). Reduce with `finite_max`, `finite_min`,
  `finite_mean`, `finite_median`, `finite_sum`, `finite_count` or `finite_values`, never with a
  pandas reduction that skips NaN. A NaN entry raises `NonFiniteValues`, naming what was reduced;
  an empty selection gives a NaN value, and a NaN value never holds, so the claim fails by name
  instead of vanishing. Rows that are legitimately
  not finite (e.g. fully masked rows) are removed by an explicit selection before the reduction,
  or with `exclude_nonfinite="reason", excluded=list`, and that list goes into the claim
  (`Claim(exclusions=...)`), which records it.
* **Mutation tests.** Every `test` claim has at least one pytest marked
  `@pytest.mark.claim_mutation("claim-id", ...)` (exact ids) that feeds the claim's own judge
  code the smallest violation it exists to catch and passes the judged claim to the
  `record_mutation` fixture (tests/conftest.py), which asserts that it fails and logs its value
  and bound. `python -m keybias.pipeline.claims mutations [--profile P]` runs the marked tests and
  prints, per test claim, its mutation tests and each mutation's distance from the bound as a
  ratio; `--collect-only` lists them without running. It exits non-zero if any test claim of the
  manifest has none.
* **Registry.** Every claim is declared once, as a `ClaimSpec` in the judge that emits it
  (`keybias.core.claimspec`; `keybias.studies.claims.load()` imports every judge). A claim whose
  id no spec declares, or whose kind, comparison, fixed bound, bound origin or notebook differs
  from its spec, is a contract error naming it. The manifests, the findings' `decided_by`, the
  rules table and the mutation markers are tested against the registry
  (tests/studies/test_claim_registry.py), and verify reads each claim's tolerance classes from it.
* **Manifest.** `params/claims/<profile>/<notebook>.json` lists the claim ids (with kinds) a
  notebook must produce in that profile; `manifest --specs` writes it from the registry. A claim missing from the run, a run claim missing from
  the manifest, or a kind that differs, is a contract error naming the claim. After changing a
  notebook's claims, run it and then
  `python -m keybias.pipeline.claims manifest --profile P --results DIR [--only NB] --write`: it rewrites
  the files of the notebooks with step records in DIR/steps only, one file per notebook, so
  branches that change different notebooks never conflict.
* **Headline counts** come from `headline_counts(claims, verdicts)`. No count sums test claims
  with the other kinds; readers' sentences come from `kind_summary`. The abstract, discussion and
  README print only these macros (written to `results/macros/claims.tex` by
  `write_headline_macros`):

    ==============================  =====================================================
    ``\\ClaimsTest``                  claims of kind `test` (the only ones to count as evidence)
    ``\\ClaimsTestHolding``           test claims that hold
    ``\\ClaimsProof``                 proof checks (SymPy identities)
    ``\\ClaimsConsistency``           consistency checks
    ``\\ClaimsImplied``               implied claims
    ``\\ClaimsMutationCovered``       test claims with a mutation test (from the register,
                                     when the pipeline passes it in; else not defined)
    ``\\IndepTests<Dtype>``           independent verdicts in that dtype (redundant or not
                                     redundant, judged against a same-dtype null)
    ``\\IndepContradictions<Dtype>``  of those, verdicts that differ from the proof's prediction
    ``\\ImpliedVerdicts<Dtype>``      verdicts in that dtype that follow from another verdict
    ``\\IndepTestsTotal``, ``\\IndepContradictionsTotal``: sums over dtypes
    ==============================  =====================================================

  `<Dtype>` is `FloatSixtyFour`, `FloatThirtyTwo`, `FloatSixteen`, `BfloatSixteen`. A sentence
  then reads "\\IndepContradictionsFloatThirtyTwo{} of \\IndepTestsFloatThirtyTwo{} independent
  tests in float32". The verdict table is `results/data/invariance.csv` (notebook 02), with the
  columns `dtype`, `verdict`, `expected` and optionally `status` and a boolean `independent`
  (False where a verdict follows from another one; absent: every measured verdict was judged
  against its own dtype's rounding null and is independent).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from keybias.core.claimspec import list_specs, spec_errors
from keybias.core.recorder import (
    CLAIM_KINDS,
    Claim,
    atomic_write_text,
    format_number,
    latex_escape,
    margin_ratio,
)
from keybias.core.reduce import (  # noqa: F401  (re-exported: judges and tests use them)
    EmptySelection,
    Exclusion,
    NonFiniteValues,
    finite_count,
    finite_max,
    finite_mean,
    finite_median,
    finite_min,
    finite_reduce,
    finite_sum,
    finite_values,
)
from keybias.studies import claims as study_claims
from keybias.studies.params import DTYPE_MACRO

ROOT = Path(__file__).resolve().parents[3]
MANIFEST_DIR = Path("params") / "claims"
VERDICT_TABLE = Path("data") / "invariance.csv"
MEASURED_VERDICTS = ("redundant", "not_redundant")
# Where a mutation test's `record_mutation` fixture writes one JSON line per judged mutation
# (tests/conftest.py); `mutations` sets it while it runs the marked tests.
MUTATION_LOG_ENV = "KEYBIAS_MUTATION_LOG"
KIND_TITLES = {
    "test": "Tests: measurements that plausible data could contradict",
    "proof": "Proof checks: exact symbolic identities, checked by SymPy (not empirical tests)",
    "control": "Positive controls: the power of the tests they protect, not findings",
    "consistency": "Consistency checks: bookkeeping cross-checks",
    "implied": "Implied: these follow from the claims they name and are not counted as evidence",
}


def evaluate(claims: list[Claim | dict]) -> dict[str, dict]:
    """{claim id: record} for `Claim`s or claim dicts (keywords of `Recorder.claim`), judged
    exactly as a notebook's Recorder judges them; nothing is written. For tests that feed a judge
    function mutated data and assert `holds` is False."""
    records = [Claim.from_any(c).record("00_evaluate", "cpu", "test") for c in claims]
    ids = [r["id"] for r in records]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ValueError(f"claim(s) {twice} given twice")
    return {r["id"]: r for r in records}


# -- manifest ---------------------------------------------------------------------------------
def manifest_dir(profile: str, root: Path = ROOT) -> Path:
    return Path(root) / MANIFEST_DIR / profile


def manifest_path(profile: str, notebook: str, root: Path = ROOT) -> Path:
    return manifest_dir(profile, root) / f"{notebook}.json"


def manifest_from_claims(claims: list[dict]) -> dict[str, dict[str, str]]:
    """{notebook: {claim id: kind}} of a run, sorted for stable diffs."""
    grouped: dict[str, dict[str, str]] = {}
    for c in claims:
        grouped.setdefault(c["notebook"], {})[c["id"]] = c.get("kind") or ""
    return {nb: dict(sorted(ids.items())) for nb, ids in sorted(grouped.items())}


def load_manifest(profile: str, root: Path = ROOT) -> dict[str, dict[str, str]] | None:
    """{notebook: {claim id: kind}} from `params/claims/<profile>/*.json`; None if there is none.

    One file per notebook, so that branches changing different notebooks never conflict.
    """
    files = sorted(manifest_dir(profile, root).glob("*.json"))
    if not files:
        return None
    manifest = {}
    for path in files:
        doc = json.loads(path.read_text())
        if doc.get("profile") != profile or doc.get("notebook") != path.stem:
            raise ValueError(f"{path}: says profile {doc.get('profile')!r}, notebook {doc.get('notebook')!r}")
        manifest[path.stem] = doc["claims"]
    return manifest


def manifest_from_specs(profile: str) -> dict[str, dict[str, str]]:
    """{notebook: {claim id: kind}} that the registry (keybias.core.claimspec) declares for `profile`."""
    study_claims.load()
    grouped: dict[str, dict[str, str]] = {}
    for spec in list_specs():
        for cid in spec.ids(profile):
            grouped.setdefault(spec.notebook, {})[cid] = spec.kind
    return {nb: dict(sorted(ids.items())) for nb, ids in sorted(grouped.items())}


def manifest_text(profile: str, notebook: str, entries: dict[str, str]) -> str:
    doc = {
        "profile": profile,
        "notebook": notebook,
        "about": "claim ids (with kinds) this notebook must produce in this profile; regenerate with "
                 f"`python -m keybias.pipeline.claims manifest --profile {profile} --results DIR --write`",
        "claims": dict(sorted(entries.items())),
    }
    return json.dumps(doc, indent=2) + "\n"


def step_claims(results: Path, profile: str) -> list[dict]:
    """The claims of every step record under `results/steps` made with `profile`."""
    claims = []
    for path in sorted((Path(results) / "steps").glob("*.json")):
        step = json.loads(path.read_text())
        if step.get("profile") == profile:
            claims += step["claims"]
    return claims


# -- the contract -----------------------------------------------------------------------------
def contract_errors(claims: list[dict], profile: str, root: Path) -> list[str]:
    """Every way `claims` break the claim contract for `profile`, one message each."""
    errors: list[str] = []
    ids = [c["id"] for c in claims]
    known = set(ids)
    for cid in sorted({i for i in ids if ids.count(i) > 1}):
        errors.append(f"claim {cid!r} recorded by more than one notebook")
    for c in claims:
        cid, kind = c["id"], c.get("kind")
        if not kind:
            errors.append(f"claim {cid!r} has no kind (one of {', '.join(CLAIM_KINDS)})")
        elif kind not in CLAIM_KINDS:
            errors.append(f"claim {cid!r} has kind {kind!r}, not one of {', '.join(CLAIM_KINDS)}")
        implied_by = c.get("implied_by") or []
        if kind == "implied":
            if not implied_by:
                errors.append(f"claim {cid!r} is implied but names no claim in implied_by")
            for other in implied_by:
                if other not in known:
                    errors.append(f"claim {cid!r} is implied by {other!r}, which the run did not produce")
                elif other == cid:
                    errors.append(f"claim {cid!r} names itself in implied_by")
        elif implied_by:
            errors.append(f"claim {cid!r} has implied_by but kind {kind!r}; only implied claims name others")
        protects = c.get("protects") or []
        if kind == "control":
            if not protects:
                errors.append(f"claim {cid!r} is a control but names no test claim in protects")
            for other in protects:
                if other not in known:
                    errors.append(f"claim {cid!r} protects {other!r}, which the run did not produce")
        elif protects:
            errors.append(f"claim {cid!r} has protects but kind {kind!r}; only controls name the tests they protect")
        if not str(c.get("bound_origin") or "").strip():
            errors.append(f"claim {cid!r} does not state its bound's origin (bound_origin)")
        if kind == "proof" and not str(c.get("identity") or "").strip():
            errors.append(f"claim {cid!r} is a proof check but does not name the identity it checks (identity)")
        if kind != "proof" and c.get("identity"):
            errors.append(f"claim {cid!r} names an identity but has kind {kind!r}; only proof checks name one")
    study_claims.load()
    for c in claims:  # every claim is built from its spec (keybias.core.claimspec) and agrees with it
        errors += spec_errors(c)
    manifest = load_manifest(profile, root)
    rel = MANIFEST_DIR / profile
    fix = f"`python -m keybias.pipeline.claims manifest --profile {profile} --results DIR --write`, then commit {rel}/"
    if manifest is None:
        errors.append(f"no claim manifest {rel}/*.json for profile {profile!r}: write it with {fix}")
        return errors
    expected = {cid: (nb, kind) for nb, entries in manifest.items() for cid, kind in entries.items()}
    produced = {c["id"]: c for c in claims}
    for cid, (nb, kind) in sorted(expected.items()):
        if cid not in produced:
            errors.append(f"claim {cid!r} ({nb}, {kind}) is in {rel}/{nb}.json but the run did not produce it")
        elif produced[cid].get("kind") and produced[cid]["kind"] != kind:
            errors.append(f"claim {cid!r} has kind {produced[cid]['kind']!r} but {rel}/{nb}.json says {kind!r}: {fix}")
    for cid, c in sorted(produced.items()):
        if cid not in expected:
            errors.append(f"claim {cid!r} ({c['notebook']}) is not in {rel}/{c['notebook']}.json: {fix}")
    return errors


# -- mutation register ------------------------------------------------------------------------
def _run_pytest(args: list[str], plugins: list, what: str, ok=(0, 5)) -> int:
    """pytest.main with its output captured; raise with the output's tail on a bad exit code."""
    import pytest  # deferred: pytest is a development dependency; the build imports this module

    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        code = int(pytest.main(args, plugins=plugins))
    if code not in ok:
        raise RuntimeError(f"{what} failed (pytest exit {code}):\n{log.getvalue()[-4000:]}")
    return code


def collect_mutations(root: Path = ROOT, tests: str = "tests") -> dict[str, list[str]]:
    """{claim id: [pytest node ids]} of every test marked `claim_mutation`, by collection only."""
    found: dict[str, list[str]] = {}

    class Collector:
        def pytest_collection_modifyitems(self, items):
            for item in items:
                for mark in item.iter_markers("claim_mutation"):
                    for cid in mark.args:
                        found.setdefault(cid, []).append(item.nodeid)

    args = ["--collect-only", "-q", "-p", "no:cacheprovider", "--rootdir", str(root), str(Path(root) / tests)]
    _run_pytest(args, [Collector()], "pytest collection")
    return {cid: sorted(set(nodes)) for cid, nodes in sorted(found.items())}


def run_mutations(root: Path = ROOT, tests: str = "tests") -> list[dict]:
    """Run every test marked `claim_mutation` and return what their `record_mutation` calls logged:
    one dict per judged mutation (node, id, value, bound, comparison, holds).

    The tests run in a fresh interpreter (their conftest and modules must not meet this one's);
    the fixture (tests/conftest.py) appends JSON lines to the file named by `MUTATION_LOG_ENV`.
    A failing mutation test is an error here, since its distance would mean nothing."""

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "mutations.jsonl"
        env = dict(os.environ, **{MUTATION_LOG_ENV: str(path)})
        args = [sys.executable, "-m", "pytest", "-q", "-m", "claim_mutation", "-p", "no:cacheprovider",
                "--rootdir", str(root), str(Path(root) / tests)]
        done = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the mutation tests failed (pytest exit {done.returncode}):\n"
                               f"{(done.stdout + done.stderr)[-4000:]}")
        lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def mutation_distance(entry: dict) -> float:
    """How far a mutation's value lies beyond the claim's bound, as a ratio: value/bound for an
    upper bound, bound/value for a lower one (1.05: 5% beyond the bound; the smallest
    violation the claim exists to catch sits just above 1). NaN for `==` claims and NaN values."""
    if entry.get("comparison") == "==":
        return math.nan
    margin = margin_ratio(entry["value"], entry["bound"], entry["comparison"])
    if margin == 0:
        return math.inf
    return 1.0 / margin if math.isfinite(margin) else math.nan


def mutation_report(manifest: dict[str, dict[str, str]], mutations: dict[str, list[str]]) -> dict:
    """Test claims with and without mutation tests, the score, and markers naming no claim.

    Proof checks may carry mutation tests (a mutated model the identity must fail on); they are
    listed apart and never required."""
    kinds = {cid: k for entries in manifest.values() for cid, k in entries.items()}
    test_claims = sorted(cid for cid, k in kinds.items() if k == "test")
    covered = {cid: mutations.get(cid, []) for cid in test_claims}
    missing = [cid for cid, nodes in covered.items() if not nodes]
    return {
        "covered": covered,
        "missing": missing,
        "score": (len(test_claims) - len(missing)) / len(test_claims) if test_claims else math.nan,
        "proof": {cid: nodes for cid, nodes in sorted(mutations.items()) if kinds.get(cid) == "proof"},
        "unknown_markers": sorted(set(mutations) - set(kinds)),
        "not_test_markers": sorted(cid for cid in mutations if kinds.get(cid) in ("consistency", "implied")),
    }


# -- headline counts --------------------------------------------------------------------------
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
        import pandas as pd

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


# -- command line -----------------------------------------------------------------------------
def _cmd_manifest(args) -> int:
    """Show how a finished run's claims differ from the manifest; `--write` updates its notebooks."""
    root = Path(args.root)
    if args.specs:
        new = manifest_from_specs(args.profile)
    else:
        claims = step_claims(Path(args.results), args.profile)
        if not claims:
            print(f"no step records of profile {args.profile!r} under {args.results}/steps", file=sys.stderr)
            return 2
        new = manifest_from_claims(claims)
    if args.only:
        unknown = sorted(set(args.only) - set(new))
        if unknown:
            print(f"--only {unknown}: no step record of these under {args.results}/steps", file=sys.stderr)
            return 2
        new = {nb: new[nb] for nb in args.only}
    old = load_manifest(args.profile, root) or {}
    changed = False
    for nb in sorted(new):
        before, after = old.get(nb, {}), new[nb]
        for cid in sorted(set(before) | set(after)):
            if before.get(cid) != after.get(cid):
                changed = True
                print(f"{nb}: {cid}: {before.get(cid, '(absent)')} -> {after.get(cid, '(removed)')}")
        if args.write:
            atomic_write_text(manifest_path(args.profile, nb, root), manifest_text(args.profile, nb, after))
            print(f"wrote {manifest_path(args.profile, nb, root)}")
    return 0 if args.write or not changed else 1


def _distance_text(entry: dict) -> str:
    value, bound, comparison = entry["value"], entry["bound"], entry["comparison"]
    where = f"value {value:.4g} {comparison} bound {bound:.4g} is false"
    distance = mutation_distance(entry)
    if comparison == "==":
        return f"{where} (an exact claim: any difference fails)"
    if math.isnan(distance):
        return f"{where} (no ratio: NaN or a zero the ratio cannot place)"
    return f"{where}: {distance:.3g}x the bound" if comparison in ("<=", "<") else f"{where}: the bound is {distance:.3g}x the value"


def _cmd_mutations(args) -> int:
    root = Path(args.root)
    manifest = load_manifest(args.profile, root)
    if manifest is None:
        print(f"no manifest under {manifest_dir(args.profile, root)}", file=sys.stderr)
        return 2
    report = mutation_report(manifest, collect_mutations(root))
    logged: dict[tuple[str, str], list[dict]] = {}
    if not args.collect_only:
        for entry in run_mutations(root):
            logged.setdefault((entry["id"], entry["node"]), []).append(entry)

    def show(cid: str, nodes: list[str]) -> None:
        for node in nodes:
            print(f"    {node}")
            entries = logged.get((cid, node), [])
            if not args.collect_only and not entries:
                print("        distance not recorded (the test does not call record_mutation)")
            for entry in entries:
                print(f"        {_distance_text(entry)}")

    for cid, nodes in report["covered"].items():
        print(f"{cid}: {len(nodes)} mutation test(s)" if nodes else f"{cid}: NO MUTATION TEST")
        show(cid, nodes)
    if report["proof"]:
        print("proof checks with mutated models (not required; a proof is not an empirical test):")
        for cid, nodes in report["proof"].items():
            print(f"  {cid}: {len(nodes)} mutation test(s)")
            show(cid, nodes)
    for cid in report["unknown_markers"]:
        print(f"warning: claim_mutation marker names {cid!r}, which is not in the {args.profile} manifest")
    for cid in report["not_test_markers"]:
        print(f"note: claim_mutation marker names {cid!r}, which is not a test claim")
    n = len(report["covered"])
    print(f"mutation score: {n - len(report['missing'])}/{n} test claims have a mutation test "
          f"({100 * report['score']:.0f}%)" if n else "mutation score: no test claims in the manifest")
    if not args.collect_only:
        measured = sum(any(logged.get((cid, node)) for node in nodes) for cid, nodes in report["covered"].items())
        print(f"mutation distances: recorded for {measured} of {n} test claims")
    if report["missing"]:
        print(f"test claims without a mutation test: {', '.join(report['missing'])}", file=sys.stderr)
        return 1
    return 0 if n else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keybias.pipeline.claims", description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    man = sub.add_parser("manifest", help="show (or --write) the manifest entries of a finished run")
    man.add_argument("--profile", default="paper")
    man.add_argument("--results", default=str(ROOT / "results"))
    man.add_argument("--write", action="store_true", help="write the run's notebooks into the manifest")
    man.add_argument("--only", nargs="+", help="only these notebooks of the run")
    man.add_argument("--specs", action="store_true",
                     help="take the claims from the registry (the judges' ClaimSpecs) instead of a run")
    mut = sub.add_parser("mutations", help="run the mutation tests; list every test claim with its mutations "
                                           "and their distance from the bound")
    mut.add_argument("--profile", default="paper")
    mut.add_argument("--collect-only", action="store_true",
                     help="only list the tests (no run, so no distances from the bound)")
    args = parser.parse_args(argv)
    return _cmd_manifest(args) if args.command == "manifest" else _cmd_mutations(args)


if __name__ == "__main__":
    sys.exit(main())
