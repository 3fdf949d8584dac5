"""The claim registry: one `ClaimSpec` per claim, declared once, in the judge that emits it.

Modelled on timm's `@register_model` / `list_models`: a judge module declares its claims at import
time with `register_claim(ClaimSpec(...))` and builds every claim it emits from its spec
(`spec.claim(statement, value, ...)`), so the id, kind, comparison, bound, bound origin and finding
are written once. Everything else that names claims reads them from here: the manifests
(`params/claims/<profile>/*.json`) and the findings' `decided_by` are tested against the registry,
verify's tolerance classes come from `ClaimSpec.value_class`/`bound_class`, and tests parametrize
over `list_claims()` instead of quoting ids.

A spec is one claim (`id="cost-memory-counts-match-modules"`) or a family of claims whose ids are
built from parameters (`id="invariance-independent-{dtype}"`, `params={"dtype": DTYPES}`); a family
enumerates its ids (`ClaimSpec.ids`), so an id built by an f-string is still declared.

The registry holds no study knowledge itself: `keybias.studies.claims.load()` imports every judge,
which fills it.
"""

from __future__ import annotations

import fnmatch
import itertools
import math
import re
import string
from dataclasses import dataclass, field
from typing import Any

from keybias.core.recorder import _COMPARISONS, CLAIM_KINDS, Claim

# Verify's tolerance class of a number that does not depend on rounding (a count, a fixed bound).
EXACT_CLASS = "exact"
_ID = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


@dataclass(frozen=True)
class ClaimSpec:
    """The declaration of one claim (or one family of claims).

    id: the claim id, or a template with `{name}` fields for a family (`params` gives each field's
        values; every combination is one claim).
    notebook: the notebook whose judge emits it.
    kind: one of `CLAIM_KINDS`.
    comparison: how the value is compared with the bound.
    bound: the bound, where it is fixed before the data; None where the judge computes it per run
        (a measured tolerance, a count that depends on the profile), which `origin` then explains.
    origin: where the bound comes from, in one phrase (theory, a held-out calibration, the issue).
        A judge may record a longer phrase with the run's numbers in it, which must begin with this
        one. Where the origin depends on which data ran (an implied claim whose parent depends on
        the tolerance that was available), a tuple of the phrases it may begin with; the first is
        the default.
    finding: for a `test` claim, the finding (keybias.studies.findings) it decides.
    value_class, bound_class: verify's tolerance classes (keybias.pipeline.outputs.TOLERANCES) of
        the claim's value and bound.
    profiles: the profiles whose runs produce it (a family may produce only some of its ids in a
        small profile; `profile_params` narrows them).
    """

    id: str
    notebook: str
    kind: str
    comparison: str = "<="
    bound: float | None = None
    origin: str | tuple[str, ...] = ""
    finding: str | None = None
    value_class: str = "f64"
    bound_class: str = EXACT_CLASS
    params: dict[str, tuple[str, ...]] = field(default_factory=dict)
    profiles: tuple[str, ...] = ("smoke", "paper")
    profile_params: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)

    def __post_init__(self):
        fields = self.fields()
        if set(fields) != set(self.params):
            raise ValueError(f"claim spec {self.id!r}: template fields {fields} but params {sorted(self.params)}")
        for cid in self.ids():
            if not _ID.fullmatch(cid):
                raise ValueError(f"claim id {cid!r}: lower-case words and digits joined by hyphens")
        if self.kind not in CLAIM_KINDS:
            raise ValueError(f"claim spec {self.id!r}: kind {self.kind!r} not one of {CLAIM_KINDS}")
        if self.comparison not in _COMPARISONS:
            raise ValueError(f"claim spec {self.id!r}: comparison {self.comparison!r} not one of {sorted(_COMPARISONS)}")
        if not all(o.strip() for o in self.origins) or not self.origins:
            raise ValueError(f"claim spec {self.id!r} does not state its bound's origin")
        if (self.kind == "test") != (self.finding is not None):
            raise ValueError(f"claim spec {self.id!r}: a test claim names the finding it decides, and only a test claim")
        if self.bound is not None:
            object.__setattr__(self, "bound", float(self.bound))
        object.__setattr__(self, "params", {k: tuple(v) for k, v in self.params.items()})

    @property
    def origins(self) -> tuple[str, ...]:
        """The phrases a claim's bound origin may begin with."""
        return (self.origin,) if isinstance(self.origin, str) else tuple(self.origin)

    def fields(self) -> list[str]:
        return sorted({name for _, name, _, _ in string.Formatter().parse(self.id) if name})

    @property
    def is_family(self) -> bool:
        return bool(self.params)

    def ids(self, profile: str | None = None) -> list[str]:
        """Every claim id of the spec (in `profile`'s runs, if given)."""
        if profile is not None and profile not in self.profiles:
            return []
        if not self.params:
            return [self.id]
        params = {**self.params, **self.profile_params.get(profile, {})}
        names = sorted(params)
        return [self.id.format(**dict(zip(names, values, strict=True)))
                for values in itertools.product(*(params[n] for n in names))]

    def params_of(self, claim_id: str) -> dict[str, str]:
        """The parameter values of the family member `claim_id` (an error if it is not one)."""
        names = sorted(self.params)
        for values in itertools.product(*(self.params[n] for n in names)):
            member = dict(zip(names, values, strict=True))
            if self.id.format(**member) == claim_id:
                return member
        raise KeyError(f"claim {claim_id!r} is not a member of the family {self.id!r}")

    def id_for(self, **params: Any) -> str:
        """The id of the family member with these parameter values (an error if not declared)."""
        if sorted(params) != self.fields():
            raise ValueError(f"claim spec {self.id!r} takes parameters {self.fields()}, got {sorted(params)}")
        for name, value in params.items():
            if str(value) not in self.params[name]:
                raise ValueError(f"claim spec {self.id!r}: {name}={value!r} is not one of {self.params[name]}")
        return self.id.format(**{k: str(v) for k, v in params.items()})

    def claim(self, statement: str, value: float, bound: float | None = None, *,
              bound_origin: str | None = None, params: dict[str, Any] | None = None, **extra: Any) -> Claim:
        """The claim this spec declares, with the judge's statement and measured value.

        `bound` is required where the spec leaves it to the run and must equal the spec's where it
        fixes one; `bound_origin`, if given, must begin with the spec's origin. `params` selects a
        family member. `extra` passes the other `Claim` fields (implied_by, protects,
        min_detectable, identity, exclusions)."""
        cid = self.id_for(**(params or {})) if self.params else self.id
        if params and not self.params:
            raise ValueError(f"claim {cid!r} is not a family; it takes no parameters")
        if self.bound is None:
            if bound is None:
                raise ValueError(f"claim {cid!r}: its spec leaves the bound to the run, and none was given")
        elif bound is not None and not _same(bound, self.bound):
            raise ValueError(f"claim {cid!r}: bound {bound!r} disagrees with its spec's {self.bound!r}")
        origin = self.origins[0] if bound_origin is None else bound_origin
        if not origin.startswith(self.origins):
            raise ValueError(f"claim {cid!r}: bound origin {origin!r} does not begin with its spec's {self.origins}")
        for key in ("kind", "comparison", "id"):
            if key in extra:
                raise ValueError(f"claim {cid!r}: {key} comes from its spec, not from the judge")
        return Claim(cid, statement, value, self.bound if bound is None else bound, self.comparison,
                     kind=self.kind, bound_origin=origin, **extra)


def _same(a: float, b: float) -> bool:
    return float(a) == float(b) or (math.isnan(float(a)) and math.isnan(float(b)))


_REGISTRY: dict[str, ClaimSpec] = {}


def register_claim(spec: ClaimSpec) -> ClaimSpec:
    """Add `spec` to the registry; an id (or a family member's id) declared twice is an error."""
    taken = {cid for other in _REGISTRY.values() for cid in other.ids()}
    twice = sorted(set(spec.ids()) & taken)
    if spec.id in _REGISTRY or twice:
        raise ValueError(f"claim(s) {twice or [spec.id]} declared twice")
    _REGISTRY[spec.id] = spec
    return spec


def list_specs(notebook: str | None = None, kind: str | None = None) -> list[ClaimSpec]:
    """The registered specs, in declaration order, optionally of one notebook or kind."""
    return [s for s in _REGISTRY.values()
            if (notebook is None or s.notebook == notebook) and (kind is None or s.kind == kind)]


def list_claims(pattern: str = "*", *, notebook: str | None = None, kind: str | None = None,
                profile: str | None = None) -> list[str]:
    """Every declared claim id matching the shell pattern, family members enumerated, sorted."""
    ids = (cid for s in list_specs(notebook, kind) for cid in s.ids(profile))
    return sorted(cid for cid in ids if fnmatch.fnmatchcase(cid, pattern))


def spec_of(claim_id: str) -> ClaimSpec:
    """The spec that declares `claim_id` (a family member resolves to its family)."""
    if claim_id in _REGISTRY:
        return _REGISTRY[claim_id]
    for spec in _REGISTRY.values():
        if spec.params and claim_id in spec.ids():
            return spec
    raise KeyError(f"claim {claim_id!r} has no ClaimSpec: declare it with register_claim in its judge")


def spec_errors(record: dict) -> list[str]:
    """Every way a claim record disagrees with its spec (none: it was built from it)."""
    cid = record["id"]
    try:
        spec = spec_of(cid)
    except KeyError as err:
        return [str(err.args[0])]
    errors = []
    for key, expected in (("kind", spec.kind), ("comparison", spec.comparison), ("notebook", spec.notebook)):
        if key in record and record[key] != expected:
            errors.append(f"claim {cid!r}: {key} {record[key]!r} but its spec says {expected!r}")
    if spec.bound is not None and not _same(record["bound"], spec.bound):
        errors.append(f"claim {cid!r}: bound {record['bound']!r} but its spec says {spec.bound!r}")
    if not str(record.get("bound_origin") or "").startswith(spec.origins):
        errors.append(f"claim {cid!r}: bound origin does not begin with its spec's {spec.origins}")
    return errors


def build_claim(id: str | None = None, statement: str | None = None, value: float | None = None,
                bound: float | None = None, comparison: str | None = None, *, claim_id: str | None = None,
                kind: str | None = None, bound_origin: str | None = None, **extra: Any) -> Claim:
    """The claim `id` built from its registered spec (`ClaimSpec.claim`), for a judge that names
    the claim by id (a family member by its full id). A kind or comparison given here must equal
    the spec's; a claim without a spec cannot be built."""
    cid = id if id is not None else claim_id
    if cid is None or (id is not None and claim_id is not None):
        raise ValueError("give the claim's id once (id or claim_id)")
    spec = spec_of(cid)
    for key, given, declared in (("kind", kind, spec.kind), ("comparison", comparison, spec.comparison)):
        if given is not None and given != declared:
            raise ValueError(f"claim {cid!r}: {key} {given!r} disagrees with its spec's {declared!r}")
    params = spec.params_of(cid) if spec.params else None
    return spec.claim(statement, value, bound, bound_origin=bound_origin, params=params, **extra)
