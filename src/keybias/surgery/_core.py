"""Plan, certify, apply, roll back: the machinery behind strip_key_bias and fold_value_bias."""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from keybias.surgery import _calls, _sites
from keybias.surgery._certify import _float64_kernels, _own_kernels, certify
from keybias.surgery._sites import Site, Slot, discover

STORAGES = ("remove", "zeros")


class SurgeryRefused(ValueError):
    """The tool refused: some module cannot be changed exactly. The model is unchanged.

    `refusals` lists one dict per refused module (module, family, reason); `report` is the
    report the tool would have returned."""

    def __init__(self, message: str, refusals: list[dict[str, Any]], report: dict[str, Any]):
        super().__init__(message)
        self.refusals = refusals
        self.report = report


class InPlaceWriteWarning(UserWarning):
    """A packed bias was re-parameterized: in-place writes to it no longer reach its storage."""


class FullyMaskedRowWarning(UserWarning):
    """fold_value_bias changes the output of fully masked query rows on PyTorch's SDPA path."""


class _KeepEntries(nn.Module):
    """Parametrization: a full bias vector computed from its kept entries (zeros elsewhere)."""

    def __init__(self, keep: torch.Tensor):
        super().__init__()
        self.register_buffer("keep", keep.clone(), persistent=False)

    def forward(self, kept: torch.Tensor) -> torch.Tensor:
        return kept.new_zeros(self.keep.shape).masked_scatter(self.keep, kept)

    def right_inverse(self, full: torch.Tensor) -> torch.Tensor:
        return full[self.keep]

    def __prepare_scriptable__(self):
        # torch.jit.script calls this on every submodule before compiling: fail here, at once,
        # rather than produce a scripted module whose every call fails.
        raise RuntimeError(
            "a bias re-parameterized by keybias.surgery (storage='remove') cannot be compiled by "
            "torch.jit.script; run strip_key_bias/fold_value_bias with storage='zeros' (explicit zeros, "
            "a plain Parameter), or use torch.export, which handles it"
        )


# ---------------------------------------------------------------------------- bias slots

def _owner(unit: nn.Module, slot: Slot) -> nn.Module:
    return unit.get_submodule(slot.owner) if slot.owner else unit


def _keep_mask(owner: nn.Module, name: str) -> torch.Tensor | None:
    if parametrize.is_parametrized(owner, name):
        return owner.parametrizations[name][0].keep.clone()
    return None


def slot_values(unit: nn.Module, slot: Slot) -> torch.Tensor:
    full = getattr(_owner(unit, slot), slot.name).detach()
    return full[slot.select()] if slot.packed else full


def slot_removed(unit: nn.Module, slot: Slot) -> bool:
    owner = _owner(unit, slot)
    if getattr(owner, slot.name, None) is None:
        return True
    keep = _keep_mask(owner, slot.name)
    if keep is None:
        return False
    sel = keep[slot.select()] if slot.packed else keep
    return not bool(sel.any())


def _private_class(module: nn.Module) -> None:
    """Give a parametrized module a class of its own before removing a parametrization.

    remove_parametrizations deletes the property from the module's class, and deep copies of a
    parametrized module share that class, so without this the original would lose it too."""
    cls = module.__class__
    body = {k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")}
    module.__class__ = type(cls.__name__, cls.__bases__, body)


@torch.no_grad()
def _drop(unit: nn.Module, slot: Slot, storage: str) -> int:
    """Remove a bias slot: None / re-parameterized (storage='remove') or zeros. Returns the
    stored entries freed."""
    owner = _owner(unit, slot)
    if not slot.packed and storage == "remove":
        saved = getattr(owner, slot.name).numel()
        setattr(owner, slot.name, None)
        return saved
    if storage == "zeros":
        if parametrize.is_parametrized(owner, slot.name):
            raise ValueError(f"{slot.name} is re-parameterized by an earlier storage='remove' call; "
                             "use the same storage for both tools")
        param = getattr(owner, slot.name)
        if slot.packed:
            param[slot.select()] = 0
        else:
            param.zero_()
        return 0
    keep = _keep_mask(owner, slot.name)
    full = getattr(owner, slot.name).detach().clone()
    if keep is None:
        keep = torch.ones(full.shape, dtype=torch.bool, device=full.device)
    else:
        _private_class(owner)
        parametrize.remove_parametrizations(owner, slot.name, leave_parametrized=True)
    sel = slot.select()
    saved = int(keep[sel].sum())
    keep[sel] = False
    full[sel] = 0
    getattr(owner, slot.name).copy_(full)
    parametrize.register_parametrization(owner, slot.name, _KeepEntries(keep))
    return saved


def _strip_change(site: Site, storage: str) -> Callable[[nn.Module], int]:
    """The change that removes b_k from one site (a function of the unit, applied to a copy to
    certify it and to the model to keep it).

    Identity: softmax_j(q_i . (W_k x_j + b_k) s + m_ij) = softmax_j(q_i . W_k x_j s + m_ij),
    since q_i . b_k s is the same for every key j of row i. With add_bias_kv the extra key moves
    with it (bias_k' = bias_k - b_k), so its score shifts by the same row constant. Holds when
    nothing acts on the key between b_k and the score (no rotary embedding, QK-norm, soft cap,
    key-dependent position term) and every key slot carries b_k: the site's refusals name the
    cases where it does not, and certification checks it on the model's calls."""
    if site.zeros_only:
        storage = "zeros"  # the forward reads the bias directly (HookedTransformer's b_K): exact zeros

    def change(unit: nn.Module) -> int:
        with torch.no_grad():
            if slot_removed(unit, site.key):
                return 0  # shared with a site handled before (the same Linear)
            b_k = slot_values(unit, site.key).clone()
            if site.key_partner is not None:
                partner = getattr(_owner(unit, site.key_partner), site.key_partner.name)
                partner.sub_(b_k.view_as(partner).to(partner.dtype))
            return _drop(unit, site.key, storage)
    return change


def expand_value_bias(b_v: torch.Tensor, width: int, heads: int) -> torch.Tensor:
    """b_v as the output projection sees it: under grouped- or multi-query attention each
    key/value head serves heads/kv query heads, so its entries repeat for each of them."""
    if b_v.numel() == width:
        return b_v
    d = width // heads if heads and width % heads == 0 else 0
    kv = b_v.numel() // d if d else 0
    if not d or kv * d != b_v.numel() or heads % kv:
        raise ValueError(f"value bias of {b_v.numel()} entries does not map onto an output projection of "
                         f"{width} inputs in {heads} heads")
    return b_v.view(kv, d).repeat_interleave(heads // kv, dim=0).reshape(-1)


def _perturb(slot: Slot, partner: Slot | None, scale: float, seed: int) -> Callable[[nn.Module], None]:
    """Add a seeded random vector to a bias slot (and to its add_bias_kv partner, which the
    identity moves with it): the direction of the redundancy probe."""
    def edit(unit: nn.Module) -> None:
        with torch.no_grad():
            param = getattr(_owner(unit, slot), slot.name)
            gen = torch.Generator().manual_seed(seed)
            sel = slot.select() if slot.packed else slice(None)
            n = param[sel].numel()
            delta = scale * torch.randn(n, generator=gen, dtype=torch.float64).to(param.dtype)
            param[sel] += delta.view(param[sel].shape)
            if partner is not None:
                other = getattr(_owner(unit, partner), partner.name)
                other += delta.view_as(other)
    return edit


def _fold_change(site: Site, storage: str) -> Callable[[nn.Module], int]:
    """The change that folds b_v into the output bias of one site: b_o' = b_o + W_o b_v, b_v' = 0
    (TransformerLens: b_O' = b_O + sum_h b_V[h] W_O[h]; BEiT/EVA: v_bias).

    Identity: when each row of weights sums to one, sum_j p_ij (W_v x_j + b_v) = sum_j p_ij W_v
    x_j + b_v, and W_o(y + b_v) + b_o = W_o y + (b_o + W_o b_v). Holds with any additive mask
    or position bias on the scores; fails in training mode with dropout on the weights, with a
    head mask, and for a fully masked row that gets zero weights (SDPA). Computed in float64
    and rounded once to the model's dtype."""
    if site.layout == "lens":  # TransformerLens: per-head b_V [h, d], W_O [h, d, m], b_O [m]
        def lens(unit: nn.Module) -> int:
            with torch.no_grad():
                b_v = unit.b_V.detach().double()
                unit.b_O.copy_((unit.b_O.double() + torch.einsum("hd,hdm->m", b_v, unit.W_O.double()))
                               .to(unit.b_O.dtype))
                return _drop(unit, site.value, "zeros")
        return lens

    if site.zeros_only:
        storage = "zeros"  # BEiT/EVA concatenate q_bias, k_bias, v_bias in the forward: v_bias stays, as zeros

    def change(unit: nn.Module) -> int:
        with torch.no_grad():
            b_v = slot_values(unit, site.value).clone()
            out = unit.get_submodule(site.out)
            w_o = out.weight.detach().double()
            w_o = w_o.T if site.out_transposed else w_o
            out.bias.copy_((out.bias.double() + w_o @ expand_value_bias(b_v.double(), w_o.shape[1], site.heads))
                           .to(out.bias.dtype))
            if site.value_partner is not None:
                partner = getattr(_owner(unit, site.value_partner), site.value_partner.name)
                partner.sub_(b_v.view_as(partner).to(partner.dtype))
            return _drop(unit, site.value, storage)
    return change


# ---------------------------------------------------------------------------- rollback

class _Snapshot:
    """Everything the tools may change in some modules, restorable bit-exactly: each module's
    class (parametrize swaps it), its parameter/buffer/child dicts, and every tensor's data
    (the same Parameter objects come back, so optimizers and tied references stay valid)."""

    def __init__(self, modules: list[nn.Module], written: set[int] | None = None):
        """`written`: ids of the tensors the tools may write in place beyond the 1-D ones (bias_k,
        TransformerLens's b_K); with it, only those and the 1-D tensors are copied (weight
        matrices are never written in place), so the snapshot costs the biases, not the model."""
        self.states = []
        self.data: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        seen = set()
        for top in modules:
            for m in top.modules():
                if id(m) in seen:
                    continue
                seen.add(id(m))
                self.states.append((m, m.__class__, dict(m._parameters), dict(m._buffers), dict(m._modules)))
                for t in list(m._parameters.values()) + list(m._buffers.values()):
                    if written is not None and t is not None and t.ndim > 1 and id(t) not in written:
                        continue
                    if t is not None and id(t) not in self.data:
                        self.data[id(t)] = (t, t.detach().clone())

    @torch.no_grad()
    def restore(self) -> None:
        for m, cls, params, buffers, children in self.states:
            m.__class__ = cls
            m._parameters.clear()
            m._parameters.update(params)
            m._buffers.clear()
            m._buffers.update(buffers)
            m._modules.clear()
            m._modules.update(children)
        for tensor, saved in self.data.values():
            tensor.data = saved


# ---------------------------------------------------------------------------- planning

def _on_meta(unit: nn.Module) -> bool:
    return any(t.is_meta for t in list(unit.parameters()) + list(unit.buffers()))


def _stored(unit: nn.Module, slot: Slot) -> tuple[torch.Tensor, str]:
    """The Parameter that actually stores a slot, and its name relative to the unit (a
    re-parameterized bias is stored in parametrizations.<name>.original)."""
    owner = _owner(unit, slot)
    prefix = f"{slot.owner}." if slot.owner else ""
    if parametrize.is_parametrized(owner, slot.name):
        return owner.parametrizations[slot.name].original, f"{prefix}parametrizations.{slot.name}.original"
    return owner._parameters[slot.name], f"{prefix}{slot.name}"


def _shared(model: nn.Module, sites: list[tuple[Site, nn.Module]], slots: Callable[[Site], list[Slot]]):
    """Names of each written parameter across the whole model (tied parameters have several),
    and which planned sites write it."""
    # A module registered under several names (nn.Sequential(layer, layer)) holds its parameter
    # once: only the first name of each (module, attribute) counts as a holder.
    names: dict[int, set[str]] = {}
    seen: set[tuple[int, str]] = set()
    for mod_name, module in model.named_modules(remove_duplicate=False):
        for leaf, p in module._parameters.items():
            if p is None or (id(module), leaf) in seen:
                continue
            seen.add((id(module), leaf))
            names.setdefault(id(p), set()).add(f"{mod_name}.{leaf}" if mod_name else leaf)
    written: dict[int, list[tuple[Site, Slot, str]]] = {}
    for site, unit in sites:
        for slot in slots(site):
            param, name = _stored(unit, slot)
            full = f"{site.unit_path}.{name}" if site.unit_path else name
            written.setdefault(id(param), []).append((site, slot, full))
    return names, written


def _report(operation: str, storage: str) -> dict[str, Any]:
    return {"operation": operation, "storage": storage, "modules": [], "modules_changed": [],
            "parameters_removed": [], "parameters_folded": [], "parameters_saved": 0, "unchanged": [],
            "refused": [], "not_handled": [], "notes": [], "message": ""}


def _entry(site: Site, action: str, **extra) -> dict[str, Any]:
    return {"module": site.name, "family": site.family, "action": action, "parameters": [], "entries": 0,
            "change": None, "tolerance": None, "change_over_tolerance": None, "reason": "", **extra}


OPERATIONS = ("strip_key_bias", "fold_value_bias")
# SDPA and the model's eager kernel agree to float32 softmax rounding (about 2^-24 relative);
# 2^-12 is 4096 times that, so a larger gap means the two compute different functions.
KERNEL_SWITCH_BOUND = 2.0**-12
_NO_INPUTS = object()


class Float64Buffers:
    """Float64 storage handed from one unit's certification copy to the next of the same shapes.

    A fresh tensor of tens of megabytes is new memory from the operating system, and touching
    it for the first time costs about as much as converting the weights into it (page faults,
    zeroed pages); a unit's copy is dead once its probes are done, so the next unit's copy is
    converted into its storage instead. Only the tools' own copies go through here, and only
    once they are no longer used."""

    SMALLEST = 2**16  # entries: below this, fresh tensors are cheap

    def __init__(self):
        self.free: dict[tuple[int, ...], list[torch.Tensor]] = {}

    def converted(self, t: torch.Tensor) -> torch.Tensor:
        """A float64 copy of `t`, in recycled storage where some of its shape is free."""
        spare = self.free.get(tuple(t.shape))
        if spare and t.device.type == "cpu":
            return spare.pop().copy_(t.detach())
        return t.detach().to(torch.float64, copy=True)

    def recycle(self, module: nn.Module) -> None:
        """Take back the large float64 tensors of a certification copy that is no longer used."""
        seen = set()
        for t in list(module.parameters()) + list(module.buffers()):
            if (t.dtype == torch.float64 and t.device.type == "cpu" and t.numel() >= self.SMALLEST
                    and id(t) not in seen and t.is_contiguous() and t.storage_offset() == 0):
                seen.add(id(t))
                self.free.setdefault(tuple(t.shape), []).append(t.detach())


def _float64_copy(unit: nn.Module, buffers: Float64Buffers | None = None) -> nn.Module:
    """copy.deepcopy(unit).double().eval() without the float32 copy in between: every floating
    parameter and buffer is converted once, straight into the copy (shared ones stay shared),
    into recycled storage where `buffers` has some."""
    buffers = buffers or Float64Buffers()
    memo: dict[int, Any] = {}
    for p in unit.parameters():
        if id(p) not in memo and p.is_floating_point():
            memo[id(p)] = nn.Parameter(buffers.converted(p), requires_grad=p.requires_grad)
    for b in unit.buffers():
        if id(b) not in memo and b.is_floating_point():
            memo[id(b)] = buffers.converted(b)
    return copy.deepcopy(unit, memo).double().eval()


def _unit_copy(unit: nn.Module, calls: list, buffers: Float64Buffers | None = None) -> nn.Module:
    """A float64 eval-mode copy of one unit (never of the whole model), on the kernel that
    computes the unit's own function: PyTorch's SDPA where it agrees with the unit's eager
    kernel (some eager kernels take the softmax in float32 even in float64), else the unit's own
    (SDPA drops terms such as attention sinks)."""
    base = _float64_copy(unit, buffers)
    switched = _float64_kernels(base)
    if switched and calls:
        own = copy.deepcopy(base)
        _own_kernels([m.config for m in own.modules() if getattr(m, "config", None) is not None
                      and getattr(m.config, "_attn_implementation", None) == "sdpa"])
        # the first output only: eager kernels also return the attention weights, SDPA does not
        y_sdpa, y_own = (_calls.unit_output(m, calls[0], first=True) for m in (base, own))
        if not _calls.change(y_own, y_sdpa) <= KERNEL_SWITCH_BOUND * float(y_own.abs().max()):
            return own
    return base


def _fresh_copies(site: Site, base: nn.Module, change: Callable[[nn.Module], int], strip: bool):
    """(fresh, change): fresh() returns `base` with its bias slots as they were, for the next
    probe. The probes edit bias slots only, so those are saved once and written back, instead of
    a deep copy of the unit per probe. The change is certified with storage='zeros', which gives
    the same numbers as 'remove' (zeros in the removed entries). A unit whose biases are already
    re-parameterized (an earlier storage='remove') gets deep copies and the change as given."""
    slots = _site_slots(site)
    if any(parametrize.is_parametrized(_owner(base, x), x.name) for x in slots):
        pristine = copy.deepcopy(base)
        return (lambda: copy.deepcopy(pristine)), change
    params = {id(p): p for p in (getattr(_owner(base, x), x.name, None) for x in slots) if p is not None}
    saved = [(p, p.detach().clone()) for p in params.values()]

    def fresh() -> nn.Module:
        with torch.no_grad():
            for p, value in saved:
                p.copy_(value)
        return base
    return fresh, (_strip_change(site, "zeros") if strip else _fold_change(site, "zeros"))


def _merged_probes(base: nn.Module, probes: list, captured: list[torch.Tensor] | None,
                   dtype: torch.dtype = torch.float32):
    """(merged call, outputs of the unchanged unit on each probe): the probes run as one batch
    where _calls.merge can join them and the batch reproduces the outputs the model's own
    forward recorded for its captured calls, else one forward per probe and no merged call.
    Those outputs were computed in the model's `dtype`, so they agree with the float64 batch to
    that dtype's rounding: KERNEL_SWITCH_BOUND, or 8 units of its machine epsilon where that is
    larger (bfloat16, float16); a misjoined batch is off by the size of the output."""
    merged = _calls.merge(probes) if captured else None
    if merged is not None:
        before = _calls.merged_outputs(base, merged, len(probes))
        rel = max(KERNEL_SWITCH_BOUND, 8 * float(torch.finfo(dtype).eps)) if dtype.is_floating_point \
            else KERNEL_SWITCH_BOUND
        if before is not None and all(
                y.shape == ref.shape and _calls.change(ref, y) <= rel * float(ref.abs().max())
                for y, ref in zip(before, captured, strict=False)):
            return merged, before
    return None, [_calls.unit_output(base, c) for c in probes]


def _same_calls(a: Any, b: Any) -> bool:
    """Two captured calls (or their parts) are the same: equal tensors, equal values."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same_calls(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same_calls(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _site_slots(site: Site) -> list[Slot]:
    return [x for x in (site.key, site.key_partner, site.value, site.value_partner, site.query,
                        Slot(site.out, site.out_bias) if site.out is not None else None) if x is not None]


def _reusable(entry: dict | None, site: Site, unit: nn.Module, calls: list) -> bool:
    """Whether the float64 copy that certified the strip of this site can certify its fold: the
    unit is called exactly as then, and every bias slot of the real unit, as the strip left it,
    equals the copy's (weight matrices are never written by the strip)."""
    if entry is None or not _same_calls(entry["calls"], calls):
        return False
    base = entry["base"]
    for slot in _site_slots(site):
        mine, theirs = getattr(_owner(unit, slot), slot.name, None), getattr(_owner(base, slot), slot.name, None)
        if (mine is None) != (theirs is None):
            return False
        if mine is not None and not torch.equal(mine.detach().double(), theirs.detach()):
            return False
    return True


def _probe_site(site: Site, model: nn.Module, calls: list, change: Callable[[nn.Module], int], strip: bool,
                seed: int, captured: list[torch.Tensor] | None = None, reuse: dict | None = None,
                buffers: Float64Buffers | None = None) -> dict[str, Any]:
    """Certify one site on the unit's real calls (captured in the model's own dtype, replayed
    in float64 on a float64 copy of the unit alone), plus random calls of the same structure:
    the change itself, the redundancy probe (b_k + a random vector: the output must not move)
    and its control (b_q + the same vector: it must). `captured`, the unit's outputs that the
    model's forward recorded, lets the calls run as one batch (checked against them).

    `reuse` (a dict kept across a strip and the fold that follows it on the same unit and calls)
    lets the fold start from the strip's float64 copy, with the strip applied, and its outputs
    after the strip, instead of a second conversion and a second unchanged run: the same numbers
    a fresh copy of the stripped unit would give, used only where `_reusable` says so."""
    unit = model.get_submodule(site.unit_path) if site.unit_path else model
    calls = [_calls.to_float64(c) for c in calls]
    result = {"certified": False, "change": math.inf, "tolerance": 0.0, "reason": ""}
    entry = reuse.pop(site.name, None) if reuse is not None else None
    try:
        if not strip and _reusable(entry, site, unit, calls):
            base, probes, merged, before = entry["base"], entry["probes"], entry["merged"], entry["after"]
            result["reused"] = True
        else:
            gen = torch.Generator().manual_seed(seed)
            probes = list(calls) + [_calls.randomized(c, gen) for c in calls]
            base = _unit_copy(unit, calls, buffers)
            merged = before = None
        fresh, change = _fresh_copies(site, base, change, strip)
        slot = site.key if strip else site.value
        scale = 1.0 + float(slot_values(base, slot).abs().max())  # before any probe edits the slot
        if before is None:
            merged, before = _merged_probes(base, probes, captured, _model_dtype(unit))
        result["batched"] = merged is not None
        after: list[torch.Tensor] = []
        delta, limit = _calls.probe(fresh(), probes, change, before=before, merged=merged, keep=after)
        result.update(change=delta, tolerance=limit)
        partner = site.key_partner if strip else site.value_partner
        if strip:
            moved, _ = _calls.probe(fresh(), probes, _perturb(slot, partner, scale, seed + 1), before=before,
                                    merged=merged)
        else:
            moved_unit = fresh()
            _perturb(slot, partner, scale, seed + 1)(moved_unit)
            moved, _ = _calls.probe(moved_unit, probes, change, merged=merged)
        control = math.inf
        if strip and site.query is not None:
            control, _ = _calls.probe(fresh(), probes, _perturb(site.query, None, scale, seed + 1), before=before,
                                      merged=merged)
    except Exception as exc:  # noqa: BLE001  (a module that cannot be probed is refused, with why)
        result["reason"] = f"could not be certified on its captured calls: {type(exc).__name__}: {exc}"
        return result
    if not (delta <= limit and moved <= limit):
        what = "b_k" if strip else "b_v (folded into b_o)"
        result["reason"] = (f"the model's real calls show the output depends on {what}: a change of "
                            f"{max(delta, moved):.3g} against the rounding bound {limit:.3g}")
        if strip:
            result["reason"] += "; " + _sites.explain_dependence(site, unit.get_submodule(site.path[len(site.unit_path):].lstrip("."))
                                                                 if site.path != site.unit_path else unit, calls)
        return result
    if strip and site.query is not None and not control > limit:
        result["reason"] = ("the redundancy probe exercised nothing: perturbing b_q did not move the output either "
                            f"({control:.3g}), so the calls say nothing about b_k")
        result["inconclusive"] = True
        return result
    result["certified"] = True
    if strip and reuse is not None:
        stripped = fresh()
        change(stripped)  # the copy as the strip leaves the unit, for the fold's probes
        reuse[site.name] = {"base": stripped, "calls": calls, "probes": probes, "merged": merged, "after": after}
        base = None
    if buffers is not None and base is not None:
        buffers.recycle(base)  # the probes are done with it
    return result


def whole_model_bound(y: torch.Tensor, dtype: torch.dtype, changed: int) -> float:
    """The rounding bound for the whole model's output change, computed in its own dtype.

    Each changed unit is certified in float64 to move its own output by at most float32's unit
    roundoff (2^-24 relative): in exact arithmetic it does not move at all. In the model's dtype
    the changed unit rounds differently, by a few units of that dtype's roundoff u, and those
    independent rounding differences add up like a random walk over the changed units; a
    factor 8 covers the growth through the layers that follow. So the bound is
    8 sqrt(n_changed) u max|y| (for a float64 model, u is float32's: the float64 certificate's
    own bound). A change that is not a rounding effect (a wrong bias removed) moves the output
    by the size of the bias's contribution, orders of magnitude above it. A float64 model uses
    float32's u: some eager kernels (Hugging Face ViT's) take the softmax in float32 even there."""
    if not y.numel():
        return 0.0
    u = 2.0**-24 if dtype == torch.float64 else float(torch.finfo(dtype).eps) / 2
    return 8.0 * math.sqrt(max(changed, 1)) * u * float(y.abs().max())


class _Modes:
    """The training flags of every module, restorable (the tools run the model in eval mode)."""

    def __init__(self, model: nn.Module):
        self.flags = [(m, m.training) for m in model.modules()]

    def restore(self) -> None:
        for m, flag in self.flags:
            m.training = flag


def _model_dtype(model: nn.Module) -> torch.dtype:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def run_surgery(model: nn.Module, operation: str, *, storage: str, certify_seed: int = 0,
                allow_dropout: bool = False, inputs: Any = None, reuse: dict | None = None,
                buffers: Float64Buffers | None = None) -> dict[str, Any]:
    """Plan every site, certify every planned change on a float64 copy (on the model's own
    calls where inputs are known), check the whole model, then apply them all; any refusal or
    error leaves the model bit-identical. `reuse`: see `_probe_site` (the same dict for a strip
    and then a fold of the same model on the same inputs); `buffers`: storage for the float64
    copies, kept across calls by a caller that certifies one module after another."""
    buffers = buffers or Float64Buffers()
    if operation not in OPERATIONS:
        raise ValueError(f"operation={operation!r} not allowed; allowed: {list(OPERATIONS)}")
    if storage not in STORAGES:
        raise ValueError(f"storage={storage!r} not allowed; allowed: {list(STORAGES)}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    strip = operation == "strip_key_bias"
    report = _report(operation, storage)
    sites, report["not_handled"] = discover(model)
    planned: list[tuple[Site, nn.Module]] = []
    refusals: list[dict[str, Any]] = []

    for site in sites:
        unit = model.get_submodule(site.unit_path) if site.unit_path else model
        slot = site.key if strip else site.value
        refusal = site.refuse_strip if strip else site.refuse_fold
        what = "key" if strip else "value"
        if slot is None:
            reason = "; ".join(site.notes) or f"no {what} bias"
            report["unchanged"].append({"module": site.name, "reason": reason})
            report["modules"].append(_entry(site, "unchanged", reason=reason))
        elif refusal:
            refusals.append(_entry(site, "refused", reason=refusal))
        elif slot_removed(unit, slot):
            reason = f"{what} bias already removed"
            report["unchanged"].append({"module": site.name, "reason": reason})
            report["modules"].append(_entry(site, "unchanged", reason=reason))
        elif _on_meta(unit):
            refusals.append(_entry(site, "refused", reason=(
                "parameters on the meta device have no values, so the change cannot be certified; "
                "materialize the weights first (keybias.surgery.plan counts without changing anything)")))
        elif not strip and site.dropout > 0 and not allow_dropout:
            refusals.append(_entry(site, "refused", reason=(
                f"attention dropout p={site.dropout}: in training mode a row of dropped weights does not sum "
                "to one (pass allow_dropout=True for a fold that is exact in eval mode)")))
        else:
            planned.append((site, unit))

    # Tied or shared parameters: a key bias shared only as a whole key bias is removed once;
    # any other sharing of a written parameter is refused, naming every holder.
    names, written = _shared(model, planned, lambda s: [x for x in (
        (s.key, s.key_partner) if strip else (s.value, s.value_partner, Slot(s.out, s.out_bias))) if x is not None])
    blocked = set()
    for pid, uses in written.items():
        holders = names.get(pid, set())
        own = {u[2] for u in uses}
        once = strip and all(u[1] is u[0].key and not u[1].packed for u in uses)
        if (len(uses) > 1 and not once) or (holders - own):
            for site, *_ in uses:
                blocked.add(site.name)
            culprit = ", ".join(sorted(holders | own))
            for site, *_ in uses:
                refusals.append(_entry(site, "refused", reason=(
                    f"shared parameter held by {culprit}: changing it for one module changes the others; "
                    "untie it first")))
    planned = [(s, u) for s, u in planned if s.name not in blocked]

    # The model's own calls: the model itself runs once in eval mode, in its own dtype, and
    # hooks record each unit's arguments (no copy of the model: each unit is copied alone, to
    # float64, when it is certified).
    calls, y_before, ran, inputs_note, captured = {}, None, False, "", {}
    if planned:
        if inputs is None:
            inputs = _calls.example_inputs(model)
        if inputs is not None:
            modes = _Modes(model)
            model.eval()
            try:
                y_before, calls = _calls.capture(model, inputs, [s.unit_path for s, _ in planned], captured)
                ran = True
            except Exception as exc:  # noqa: BLE001
                inputs_note = f"the whole-model forward on the example inputs failed ({type(exc).__name__}: {exc})"
                report["notes"].append(inputs_note + "; only verified classes were certified")
                calls = {}
            finally:
                modes.restore()

    certified = []
    for site, unit in planned:
        change = _strip_change(site, storage) if strip else _fold_change(site, storage)
        if calls.get(site.unit_path):
            result = _probe_site(site, model, calls[site.unit_path], change, strip, certify_seed,
                                 captured.get(site.unit_path), reuse, buffers)
        elif site.trusted or site.layout == "mha" or site.family == "torch.ao quantizable MHA":
            result = certify(unit, site, change, seed=certify_seed)
            result.setdefault("reason", "")
        else:
            why = ("it was not called by the whole-model forward on the example inputs" if ran else
                   inputs_note or "no inputs this model accepts were given or could be built (pass inputs=)")
            report["not_handled"].append({"module": site.name, "type": site.module_type or site.family,
                                          "reason": f"not certified: {why}; its biases were left as they are"})
            continue
        if result.get("inconclusive"):  # nothing proven either way: left alone and listed, not refused
            report["not_handled"].append({"module": site.name, "type": site.module_type or site.family,
                                          "reason": f"not certified: {result['reason']}; its biases were left as they are"})
            continue
        ratio = result["change"] / result["tolerance"] if result["tolerance"] > 0 else float("inf")
        if not result["certified"]:
            reason = result.get("reason") or (
                f"certification failed: the float64 output changed by {result['change']:.3g}, above the "
                f"rounding tolerance {result['tolerance']:.3g}")
            refusals.append(_entry(site, "refused", change=result["change"], tolerance=result["tolerance"],
                                   change_over_tolerance=ratio, reason=reason))
        else:
            certified.append((site, unit, change, result, ratio))

    if refusals:
        report["refused"] = refusals
        lines = [f"{r['module']} ({r['family']}): {r['reason']}" for r in refusals]
        raise SurgeryRefused(f"{operation} refused, model unchanged:\n  " + "\n  ".join(lines), refusals, report)

    written_ids = set()
    for site, unit, *_ in certified:
        for x in (site.key, site.key_partner, site.value, site.value_partner,
                  Slot(site.out, site.out_bias) if site.out is not None else None):
            if x is not None:
                written_ids.add(id(_stored(unit, x)[0]) if getattr(_owner(unit, x), x.name, None) is not None else 0)
    snapshot = _Snapshot([u for _, u, *_ in certified], written_ids)
    try:
        for site, unit, change, result, ratio in certified:
            slot = site.key if strip else site.value
            entries = 0 if slot_removed(unit, slot) else slot_values(unit, slot).numel()
            saved = change(unit)
            removed = slot.describe(site.unit_path)
            entry = _entry(site, "removed" if strip else "folded", parameters=[removed],
                           entries=entries, change=result["change"],
                           tolerance=result["tolerance"], change_over_tolerance=ratio)
            report["modules"].append(entry)
            report["modules_changed"].append(site.name)
            report["parameters_removed"].append(removed)
            report["parameters_saved"] += saved
            partner = site.key_partner if strip else site.value_partner
            if partner is not None:
                report["parameters_folded"].append(f"{removed} -> {partner.describe(site.unit_path)}")
            if not strip:
                report["parameters_folded"].append(f"{removed} -> {Slot(site.out, site.out_bias).describe(site.unit_path)}")
        # The whole model, as it is called, in its own dtype: every certified change at once,
        # judged against the rounding bound of that dtype; rolled back if it does not hold.
        if ran and certified:
            modes = _Modes(model)
            model.eval()
            try:
                with torch.no_grad():  # a check, not a training step: no autograd graph
                    y_after = _calls.flatten(_calls.run_model(model, inputs))
                delta = _calls.change(y_before, y_after)
            except Exception as exc:  # noqa: BLE001
                delta = math.inf
                report["notes"].append(f"whole-model check failed to run: {type(exc).__name__}: {exc}")
            finally:
                modes.restore()
            dtype = _model_dtype(model)
            limit = whole_model_bound(y_before, dtype, len(certified))
            report["whole_model"] = {"change": delta, "bound": limit, "holds": delta <= limit,
                                     "dtype": str(dtype).removeprefix("torch.")}
            if not delta <= limit:
                refusals = [_entry(site, "refused", change=delta, tolerance=limit, reason=(
                    f"the whole model's {report['whole_model']['dtype']} output moved by {delta:.3g} (rounding "
                    f"bound {limit:.3g}) when every certified change was applied together")) for site, *_ in certified]
                report["refused"] = refusals
                report["modules"] = [m for m in report["modules"] if m["action"] == "unchanged"]
                report["modules_changed"], report["parameters_removed"], report["parameters_folded"] = [], [], []
                report["parameters_saved"] = 0
                raise SurgeryRefused(f"{operation} refused, model unchanged:\n  " + "\n  ".join(
                    f"{r['module']} ({r['family']}): {r['reason']}" for r in refusals), refusals, report)
    except BaseException:
        snapshot.restore()
        raise

    if storage == "remove" and any(s.key.packed if strip else s.value.packed
                                   for s, *_ in certified):
        note = ("packed biases (in_proj_bias, c_attn.bias) are re-parameterized: in-place writes to them "
                "(zero_, copy_, _reset_parameters) no longer reach the stored entries; write to "
                "<module>.parametrizations.<name>.original instead, or use storage='zeros'")
        report["notes"].append(note)
        warnings.warn(note, InPlaceWriteWarning, stacklevel=3)
    if not sites and not report["not_handled"]:
        report["message"] = "no attention modules found; nothing to do"
    elif not certified and not report["unchanged"]:
        report["message"] = "no attention modules that this tool handles; see not_handled"
    return report


def plan(model: nn.Module) -> dict[str, Any]:
    """What the tools would do, without changing or certifying anything (works on the meta
    device): per site, the family, the key/value bias entries and any refusal reason."""
    sites, unknown = discover(model)
    rows = []
    for site in sites:
        unit = model.get_submodule(site.unit_path) if site.unit_path else model
        sizes = {}
        for what, slot in (("key", site.key), ("value", site.value)):
            sizes[what] = 0 if slot is None or slot_removed(unit, slot) else slot_values(unit, slot).numel()
        rows.append({"module": site.name, "family": site.family, "key_bias_entries": sizes["key"],
                     "value_bias_entries": sizes["value"], "refuse_strip": site.refuse_strip or "",
                     "refuse_fold": site.refuse_fold or ""})
    return {"sites": rows, "not_handled": unknown,
            "key_bias_entries": sum(r["key_bias_entries"] for r in rows if not r["refuse_strip"]),
            "value_bias_entries": sum(r["value_bias_entries"] for r in rows if not r["refuse_fold"])}
