"""The claim contract: kinds, the committed manifest, the mutation register and headline counts.

A claim is evidence only if it could have failed. The pipeline hands every gathered claim to
`contract_errors`; a non-empty answer stops the build before the paper, naming each claim.

The code lives by idea in `keybias.pipeline.claim_contract` (`evaluate`, the manifest,
`contract_errors`), `keybias.pipeline.claim_mutations` (the mutation register) and
`keybias.pipeline.claim_headline` (headline counts, readers' sentences, macros, the appendix
table); this module re-exports them and is their command line.

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
import sys
from pathlib import Path

from keybias.core.claimspec import list_specs, spec_errors  # noqa: F401  (re-exported)
from keybias.core.recorder import (  # noqa: F401  (re-exported)
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
from keybias.pipeline.claim_contract import (  # noqa: F401  (re-exported)
    MANIFEST_DIR,
    ROOT,
    contract_errors,
    evaluate,
    load_manifest,
    manifest_dir,
    manifest_from_claims,
    manifest_from_specs,
    manifest_path,
    manifest_text,
    step_claims,
)
from keybias.pipeline.claim_headline import (  # noqa: F401  (re-exported)
    BUILD_MACRO_FILES,
    KIND_NOUNS,
    KIND_TITLES,
    MACRO_DEFINITION,
    MEASURED_VERDICTS,
    VERDICT_TABLE,
    claims_table,
    headline_counts,
    headline_macros,
    kind_summary,
    macro_index,
    write_headline_macros,
    write_macro_index,
)
from keybias.pipeline.claim_mutations import (  # noqa: F401  (re-exported)
    MUTATION_LOG_ENV,
    collect_mutations,
    distance_text,
    mutation_distance,
    mutation_report,
    run_mutations,
)


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
                print(f"        {distance_text(entry)}")

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
