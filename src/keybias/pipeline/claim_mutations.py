"""The mutation register: which pytest feeds each test claim the violation it exists to catch.

Every `test` claim has at least one test marked `@pytest.mark.claim_mutation("claim-id")`;
`collect_mutations` finds them by collection only, `run_mutations` runs them in a fresh
interpreter and reads what their `record_mutation` fixture (tests/conftest.py) logged, and
`mutation_report` scores the manifest's test claims against the register.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from keybias.core.recorder import margin_ratio
from keybias.pipeline.claim_contract import ROOT

# Where a mutation test's `record_mutation` fixture writes one JSON line per judged mutation
# (tests/conftest.py); `mutations` sets it while it runs the marked tests.
MUTATION_LOG_ENV = "KEYBIAS_MUTATION_LOG"


def _run_pytest(args: list[str], plugins: list, what: str, ok=(0, 5)) -> int:
    """pytest.main with its output captured; raise with the output's tail on a bad exit code."""
    # a development dependency, imported here so that the manifest commands neither need nor load it
    import pytest

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


def distance_text(entry: dict) -> str:
    value, bound, comparison = entry["value"], entry["bound"], entry["comparison"]
    where = f"value {value:.4g} {comparison} bound {bound:.4g} is false"
    distance = mutation_distance(entry)
    if comparison == "==":
        return f"{where} (an exact claim: any difference fails)"
    if math.isnan(distance):
        return f"{where} (no ratio: NaN or a zero the ratio cannot place)"
    return f"{where}: {distance:.3g}x the bound" if comparison in ("<=", "<") else f"{where}: the bound is {distance:.3g}x the value"
