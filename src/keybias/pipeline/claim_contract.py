"""The claim contract: what a run's claims must satisfy before the paper is built.

`evaluate` judges claims exactly as a notebook's Recorder does (for tests that feed a judge
mutated data); the manifest (`params/claims/<profile>/<notebook>.json`) lists the claim ids and
kinds each notebook must produce; `contract_errors` names every way a run's claims break the
contract (kinds, bound origins, implied and protected claims, the registry of `ClaimSpec`s and
the manifest). The conventions are set out in `keybias.pipeline.claims`.
"""

from __future__ import annotations

import json
from pathlib import Path

from keybias.core.claimspec import list_specs, spec_errors
from keybias.core.recorder import CLAIM_KINDS, Claim
from keybias.studies import claims as study_claims

ROOT = Path(__file__).resolve().parents[3]
MANIFEST_DIR = Path("params") / "claims"


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
