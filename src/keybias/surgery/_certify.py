"""Certification: a change is kept only if the module's own function did not move beyond rounding.

For one site, a float64 copy of its unit (the attention module, or its parent when the output
projection lives there) runs on seeded random inputs, with a padding mask where the module
takes one, before and after the change. The change of the output projection's result is
judged against `keybias.verdict.output_tolerance` in float64, computed from the measured
queries, keys and values of both runs (score magnitude, output-space value bound, head size,
number of keys). A change above it is refused before the real model is touched.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
from torch import nn

from keybias import verdict
from keybias.surgery._sites import Site

BATCH, QUERIES, KEYS = 2, 5, 6


def _heads_view(t: torch.Tensor, heads: int) -> torch.Tensor:
    b, n, e = t.shape
    return t.reshape(b, n, heads, e // heads).transpose(1, 2)


def _mha_inputs(unit: nn.MultiheadAttention, gen: torch.Generator):
    q = torch.randn(BATCH, QUERIES, unit.embed_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(BATCH, KEYS, unit.kdim, generator=gen, dtype=torch.float64)
    v = torch.randn(BATCH, KEYS, unit.vdim, generator=gen, dtype=torch.float64)
    mask = torch.zeros(BATCH, KEYS, dtype=torch.bool)
    mask[1, -1] = True  # one padded key, never a fully masked row
    return q, k, v, mask


def _mha_qkv(unit: nn.MultiheadAttention, q, k, v):
    """The projected q, k, v that nn.MultiheadAttention computes (batch first)."""
    e = unit.embed_dim
    b = unit.in_proj_bias
    if unit._qkv_same_embed_dim:
        wq, wk, wv = unit.in_proj_weight.split(e)
    else:
        wq, wk, wv = unit.q_proj_weight, unit.k_proj_weight, unit.v_proj_weight
    bq, bk, bv = (None, None, None) if b is None else b.split(e)
    kk, vv = nn.functional.linear(k, wk, bk), nn.functional.linear(v, wv, bv)
    if unit.bias_k is not None:
        kk = torch.cat([kk, unit.bias_k.expand(kk.shape[0], 1, e)], 1)
        vv = torch.cat([vv, unit.bias_v.expand(vv.shape[0], 1, e)], 1)
    return nn.functional.linear(q, wq, bq), kk, vv


def _run(unit: nn.Module, site: Site, seed: int) -> dict[str, torch.Tensor]:
    """One forward of the unit in float64 eval mode: output y and the q, k, v it used."""
    gen = torch.Generator().manual_seed(seed)
    seen: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Callable:
        def hook(_module, _inputs, output):
            seen.setdefault(name, output)
        return hook

    hooks = []
    if isinstance(unit, nn.MultiheadAttention):
        q, k, v, mask = _mha_inputs(unit, gen)
        if site.layout != "mha":  # torch.ao quantizable MHA projects through linear_Q/K/V
            for name, proj in zip(("q", "k", "v"), site.projections, strict=True):
                hooks.append(unit.get_submodule(proj).register_forward_hook(keep(name)))
        if not unit.batch_first:
            q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        try:
            y = unit(q, k, v, key_padding_mask=mask, need_weights=False)[0]
        finally:
            for h in hooks:
                h.remove()
        if not unit.batch_first:
            q, k, v, y = (t.transpose(0, 1) for t in (q, k, v, y))
        for name in ("q", "k", "v"):
            if name in seen:  # the quantizable module projects sequence-first
                seen[name] = seen[name].transpose(0, 1)
        if site.layout == "mha":
            seen["q"], seen["k"], seen["v"] = _mha_qkv(unit, q, k, v)
        seen["y"] = y
        return seen

    if site.layout == "packed":
        packed = site.projections[-1]
        if len(site.projections) == 2:  # cross-attention: q from q_attn, [k | v] from c_attn
            hooks.append(unit.get_submodule(site.projections[0]).register_forward_hook(keep("q")))
        hooks.append(unit.get_submodule(packed).register_forward_hook(keep("packed")))
    else:
        for name, proj in zip(("q", "k", "v"), site.projections, strict=True):
            hooks.append(unit.get_submodule(proj).register_forward_hook(keep(name)))
    hooks.append(unit.get_submodule(site.out).register_forward_hook(keep("y")))
    width = (unit.get_submodule(site.projections[0]).weight.shape[0 if site.layout == "packed" else 1])
    hidden = torch.randn(BATCH, QUERIES, width, generator=gen, dtype=torch.float64)
    mask = torch.zeros(BATCH, 1, QUERIES, QUERIES, dtype=torch.float64)
    mask[1, :, :, -1] = torch.finfo(torch.float64).min  # one padded key
    kwargs = {"attention_mask": mask}
    if getattr(unit, "is_cross_attention", False):
        kwargs = {"encoder_hidden_states": hidden, "encoder_attention_mask": mask}
    try:
        unit(hidden, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    if "packed" in seen:
        parts = seen.pop("packed").chunk(2 if "q" in seen else 3, dim=-1)
        if "q" in seen:
            seen["k"], seen["v"] = parts
        else:
            seen["q"], seen["k"], seen["v"] = parts
    return seen


def _tolerance(site: Site, unit: nn.Module, runs: list[dict[str, torch.Tensor]]) -> float:
    """verdict.output_tolerance in float64 for the larger of the two runs' magnitudes."""
    heads = site.heads if runs[0]["q"].shape[-1] % site.heads == 0 else 1
    d = runs[0]["q"].shape[-1] // heads
    out = unit.get_submodule(site.out)
    w_o = out.weight.detach().double()
    w_o = w_o.T if site.out_transposed else w_o
    score, value, y_max = 0.0, 0.0, 0.0
    for run in runs:
        qh, kh = _heads_view(run["q"].abs(), heads), _heads_view(run["k"].abs(), heads)
        score = max(score, float((qh @ kh.transpose(-1, -2)).amax()) / math.sqrt(d))
        v_max = run["v"].abs().amax(dim=(0, 1))
        value = max(value, float((w_o.abs() @ v_max).amax()))
        y_max = max(y_max, float(run["y"].abs().amax()))
    n_keys = runs[0]["k"].shape[1] + (1 if getattr(unit, "add_zero_attn", False) else 0)
    return verdict.output_tolerance("float64", head_dim=d, n_keys=n_keys, score_abs_max=score,
                                    value_abs_max=value, out_dim=w_o.shape[1], output_abs_max=y_max)


def _float64_kernels(work: nn.Module) -> list:
    """Certify with PyTorch's SDPA kernel: some eager Hugging Face kernels (ViT's) take the
    softmax in float32 even in a float64 model, which float64's tolerance does not allow for.
    The copy gets its own config, so the caller's model keeps its kernel. Returns the configs
    switched, so that a caller can switch them back (`_own_kernels`) where SDPA computes a
    different function (it ignores attention sinks, for one)."""
    switched = []
    for module in work.modules():
        config = getattr(module, "config", None)
        if getattr(config, "_attn_implementation", None) == "eager":
            try:
                config._attn_implementation = "sdpa"
                switched.append(config)
            except (ValueError, AttributeError):
                pass
    return switched


def _own_kernels(switched: list) -> None:
    for config in switched:
        config._attn_implementation = "eager"


def certify(unit: nn.Module, site: Site, change: Callable[[nn.Module], None], *, seed: int = 0) -> dict[str, float]:
    """Apply `change` to a float64 eval-mode copy of `unit`; return the output change, its
    rounding tolerance and whether the change is within it (non-finite outputs never are)."""
    work = copy.deepcopy(unit).double().eval()
    _float64_kernels(work)
    with torch.no_grad():
        before = _run(work, site, seed)
        change(work)
        after = _run(work, site, seed)
    diff = (after["y"] - before["y"]).abs()
    finite = bool(torch.isfinite(diff).all()) and diff.numel() > 0
    delta = float(diff.max()) if finite else math.inf
    tol = _tolerance(site, work, [before, after]) if finite else 0.0
    return {"change": delta, "tolerance": tol, "certified": finite and delta <= tol}
