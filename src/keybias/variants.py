"""Reference implementations of attention variants, each with a flag that drops the key bias.

Every variant computes, per head h with head size d,

    q_i = W_q x_i + b_q,   k_j = W_k x_j + b_k,   v_j = W_v x_j + b_v,
    y_i = W_o concat_h(sum_j w_ij v_j) + b_o,

and differs only in how the weights w_ij come from q and k. Plain softmax attention is
invariant under b_k -> b_k + delta because every score of row i moves by the same q_i . delta
and softmax ignores a constant shift of its row. That argument needs four things:

  (A1) every key slot of the row goes through the biased key projection;
  (A2) scores are linear in k_j (s_ij = q_i . k_j / sqrt(d) + terms that do not involve b_k);
  (A3) no per-key transformation follows the bias (it would turn delta into delta_j);
  (A4) the weights are a softmax over exactly those slots (shift invariance).

`DROP_IS_EXACT` says for each variant whether dropping b_k (`drop_key_bias=True`) is exact and,
if not, which assumption fails. The sweep (keybias.studies.invariance.measure) measures it in floating point.
"""

from __future__ import annotations

import math

import torch

VARIANTS = ("softmax", "alibi", "rope", "qk_norm", "cosine", "sigmoid", "sink_logit", "sink_key")

# variant -> (dropping b_k is exact?, the reason: which assumption holds or fails)
DROP_IS_EXACT = {
    "softmax": (True, "all scores of a row shift by q.b_k; softmax is shift invariant"),
    "alibi": (True, "the position bias -m|i-j| does not involve b_k; the row still shifts by q.b_k"),
    "rope": (False, "(A3) the rotation R_j acts after the bias, so the shift q.R_{j-i} b_k depends on j"),
    "qk_norm": (False, "(A2) the norm divides k_j + b_k by its own length: scores are not linear in k"),
    "cosine": (False, "(A2) cosine similarity normalises k_j + b_k: scores are not linear in k"),
    "sigmoid": (False, "(A4) sigmoid weights are not normalised over the row, so a shift changes them"),
    "sink_logit": (False, "(A1) the learned sink logit gets no q.b_k shift; no parameter can absorb it"),
    "sink_key": (False, "(A1) the learned sink key is not projected; exact only jointly (sink_key += b_k)"),
}


def _check(variant: str, embed_dim: int, num_heads: int) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r} unknown; allowed: {list(VARIANTS)}")
    if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
        raise ValueError(
            f"embed_dim={embed_dim} must be a positive multiple of num_heads={num_heads}"
        )


def init_params(
    embed_dim: int,
    num_heads: int,
    *,
    variant: str = "softmax",
    seed: int = 0,
    bias_scale: float = 0.5,
    dtype: torch.dtype = torch.float64,
    device: str = "cpu",
) -> dict[str, torch.Tensor]:
    """Random parameters (nonzero biases, so dropping b_k is a real change) for `attention`."""
    _check(variant, embed_dim, num_heads)
    gen = torch.Generator().manual_seed(seed)
    d = embed_dim // num_heads

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(device, dtype)

    w = 1.0 / math.sqrt(embed_dim)
    params = {
        "w_q": rnd(embed_dim, embed_dim, scale=w),
        "w_k": rnd(embed_dim, embed_dim, scale=w),
        "w_v": rnd(embed_dim, embed_dim, scale=w),
        "w_o": rnd(embed_dim, embed_dim, scale=w),
        "b_q": rnd(embed_dim, scale=bias_scale),
        "b_k": rnd(embed_dim, scale=bias_scale),
        "b_v": rnd(embed_dim, scale=bias_scale),
        "b_o": rnd(embed_dim, scale=bias_scale),
    }
    if variant == "qk_norm":
        params["q_gain"] = 1 + rnd(d, scale=0.1)
        params["k_gain"] = 1 + rnd(d, scale=0.1)
    if variant == "cosine":
        params["logit_scale"] = math.log(10.0) + rnd(num_heads, scale=0.1)
    if variant == "sink_logit":
        params["sink_logit"] = rnd(num_heads)
    if variant == "sink_key":
        params["sink_key"] = rnd(num_heads, d)
        params["sink_value"] = rnd(num_heads, d)
    return params


def _heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    b, n, e = t.shape
    return t.view(b, n, num_heads, e // num_heads).transpose(1, 2)


def rope(t: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate pairs (2i, 2i+1) of the last dim by angle pos * base^(-2i/d); t is [B, H, L, d]."""
    d = t.shape[-1]
    half = d // 2
    if half == 0:
        return t
    pos = torch.arange(t.shape[-2], device=t.device, dtype=torch.float64)
    freq = base ** (-torch.arange(half, device=t.device, dtype=torch.float64) * 2 / d)
    ang = (pos[:, None] * freq[None, :]).to(t.dtype)
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = t[..., 0 : 2 * half : 2], t[..., 1 : 2 * half : 2]
    out = t.clone()
    out[..., 0 : 2 * half : 2] = x1 * cos - x2 * sin
    out[..., 1 : 2 * half : 2] = x1 * sin + x2 * cos
    return out


def _rms(t: torch.Tensor, gain: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * gain


def projections(x_q, x_kv, params, *, num_heads: int, variant: str = "softmax", drop_key_bias: bool = False):
    """Per-head q [B,H,Lq,d], k and v [B,H,Lk(+1),d] as the variant scores them (sink slot included)."""
    b_k = torch.zeros_like(params["b_k"]) if drop_key_bias else params["b_k"]
    q = _heads(x_q @ params["w_q"].T + params["b_q"], num_heads)
    k = _heads(x_kv @ params["w_k"].T + b_k, num_heads)
    v = _heads(x_kv @ params["w_v"].T + params["b_v"], num_heads)
    if variant == "rope":
        q, k = rope(q), rope(k)
    if variant == "sink_key":
        bsz = q.shape[0]
        k = torch.cat([k, params["sink_key"][None, :, None, :].expand(bsz, -1, 1, -1)], dim=2)
        v = torch.cat([v, params["sink_value"][None, :, None, :].expand(bsz, -1, 1, -1)], dim=2)
    return q, k, v


def attention(
    x_q: torch.Tensor,
    x_kv: torch.Tensor,
    params: dict[str, torch.Tensor],
    *,
    num_heads: int,
    variant: str = "softmax",
    drop_key_bias: bool = False,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of `variant` on batch-first inputs; `attn_mask` is bool [Lq, Lk], True = masked.

    With `drop_key_bias=True` the key projection has no bias. This is exact (same function for
    every input) iff the variant satisfies (A1)-(A4) of the module docstring; see DROP_IS_EXACT.
    """
    embed_dim = x_q.shape[-1]
    _check(variant, embed_dim, num_heads)
    q, k, v = projections(
        x_q, x_kv, params, num_heads=num_heads, variant=variant, drop_key_bias=drop_key_bias
    )
    d = q.shape[-1]
    lq, lk = q.shape[2], x_kv.shape[1]
    if variant == "qk_norm":
        q, k = _rms(q, params["q_gain"]), _rms(k, params["k_gain"])
    if variant == "cosine":
        qn = q / q.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        kn = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        scores = (qn @ kn.transpose(-1, -2)) * params["logit_scale"].exp()[None, :, None, None]
    else:
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    if variant == "alibi":
        h = torch.arange(1, num_heads + 1, device=q.device, dtype=torch.float64)
        slopes = (2.0 ** (-8.0 * h / num_heads)).to(q.dtype)
        i = torch.arange(lq, device=q.device)[:, None]
        j = torch.arange(scores.shape[-1], device=q.device)[None, :]
        scores = scores - slopes[:, None, None] * (i - j).abs().to(q.dtype)
    mask = None
    if attn_mask is not None:
        mask = attn_mask
        if scores.shape[-1] > lk:  # the sink slot is never masked
            pad = torch.zeros(lq, scores.shape[-1] - lk, dtype=torch.bool, device=q.device)
            mask = torch.cat([mask, pad], dim=-1)
    if variant == "sigmoid":
        weights = torch.sigmoid(scores - math.log(scores.shape[-1]))
        if mask is not None:
            weights = weights.masked_fill(mask, 0.0)
    else:
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        if variant == "sink_logit":
            sink = params["sink_logit"][None, :, None, None].expand(*scores.shape[:3], 1)
            weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            weights = torch.softmax(scores, dim=-1)
    out = (weights @ v).transpose(1, 2).reshape(x_q.shape[0], lq, embed_dim)
    return out @ params["w_o"].T + params["b_o"]
