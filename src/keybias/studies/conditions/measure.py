"""Exact conditions of the theorem beyond the assumption table, each checked numerically.

The theorem (notebook 01) says: when every score of query i moves by the same q_i.b_k, the
key bias changes nothing and its gradient is zero. This module checks, in float64, the cases
where that premise holds or fails in less obvious ways: losses that see b_k other than
through the output, optimizers that add their own term to the gradient, biases tied across
projections, score nonlinearities, relative-position terms that multiply the key, grouped
key heads, partial rotary embeddings, a LayerNorm on the keys, and the conditions under which
b_v folds into the output bias.

Three layers, as in every study module:
- measure: `measure(cfg)` runs every case of `CASES` on every seed of a `ConditionsConfig` and returns one row per
  (case, seed) with the relative effect of perturbing the parameter in question;
- judge: `judge(frame)` is pure (DataFrame in, `Claim`s out), so a test can hand it
  doctored data; `summary(frame)` reduces seeds the same way for tables and macros;
- show: `table_latex(summary)` and `effect_figure(summary)`.

Every case predicts `redundant` or `not_redundant` from algebra alone, before any number is
computed; the bounds below are fixed by float64 rounding and by Adam's first step.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from keybias.core.recorder import Claim, format_number
from keybias.core.reduce import finite_max, finite_min
from keybias.studies.config import StudyConfig
from keybias.studies.params import Param, ParameterError

PARAMETERS = {
    "embed_dim": Param(int, positive=True, maximum=256, help="model width E of every case"),
    "num_heads": Param(int, positive=True, maximum=16, help="query heads; E/num_heads must be a multiple of 4"),
    "seq_len": Param(int, minimum=2, maximum=64, help="tokens per sequence"),
    "batch": Param(int, positive=True, maximum=16, help="sequences per case"),
    "softcap": Param(float, positive=True, help="logit soft-capping constant c in c*tanh(s/c)"),
    "weight_decay": Param(float, positive=True, maximum=1.0, help="coupled weight decay of the Adam case"),
    "regulariser": Param(float, positive=True, help="weight of the L2 penalty on b_k"),
    "dropout": Param(float, positive=True, maximum=0.9, help="attention dropout of the fold case"),
    "seeds": Param(int, many=True, minimum=0, help="independent draws of weights and inputs"),
}



@dataclass(frozen=True)
class ConditionsConfig(StudyConfig):
    """Every setting of notebook 07, validated once against `PARAMETERS`; defaults = the smoke profile."""

    PARAMETERS = PARAMETERS
    STUDY = "07_conditions"

    embed_dim: int = 8
    num_heads: int = 2
    seq_len: int = 4
    batch: int = 1
    softcap: float = 5.0
    weight_decay: float = 0.01
    regulariser: float = 0.01
    dropout: float = 0.3
    seeds: tuple[int, ...] = (0,)

    def check(self) -> None:
        try:
            check_parameters(self.embed_dim, self.num_heads, self.seq_len, self.batch)
        except ValueError as exc:
            raise ParameterError(f"{self.STUDY}: {exc}") from exc


# Bounds, fixed from theory before any data (the claims name these origins):
# float64 has unit roundoff 1.1e-16; a handful of sums of O(1) terms stays below 1e-13
# relative, so 1e-10 leaves three orders of margin for "no effect".
REDUNDANT_MAX = 1e-10
REDUNDANT_ORIGIN = "theory: float64 rounding (unit roundoff 1.1e-16) with three orders of margin"
# A real dependence on the parameter must stand four orders above that tolerance.
BREAK_MIN = 1e-6
BREAK_ORIGIN = "theory: four orders of magnitude above the float64 rounding tolerance"
# Adam divides the gradient by sqrt(v)+eps: a float64 rounding gradient (< 1e-15) over
# eps = 1e-8 moves a parameter by < 1e-7 learning rates; a real gradient moves it by ~1.
ADAM_STILL_MAX = 1e-6
ADAM_STILL_ORIGIN = "theory: a float64 rounding gradient over Adam's eps=1e-8 moves < 1e-7 learning rates"
ADAM_MOVES_MIN = 0.5
ADAM_MOVES_ORIGIN = "theory: Adam's first step moves a coordinate whose gradient exceeds eps by one learning rate"
ADAM_LR = 1e-3
ADAM_EPS = 1e-8

QUANTITIES = {
    # quantity: (redundant bound, origin, not-redundant bound, origin, what `effect` is)
    "output": (REDUNDANT_MAX, REDUNDANT_ORIGIN, BREAK_MIN, BREAK_ORIGIN,
               "max |out(p + delta) - out(p)| / max |out(p)|"),
    "gradient": (REDUNDANT_MAX, REDUNDANT_ORIGIN, BREAK_MIN, BREAK_ORIGIN,
                 "||dL/db_k|| / ||dL/db_q||"),
    "adam_step": (ADAM_STILL_MAX, ADAM_STILL_ORIGIN, ADAM_MOVES_MIN, ADAM_MOVES_ORIGIN,
                  "max |delta b_k| / lr after one Adam step"),
    "fold": (REDUNDANT_MAX, REDUNDANT_ORIGIN, BREAK_MIN, BREAK_ORIGIN,
             "max |out(folded) - out(original)| / max |out(original)|"),
}
REDUNDANT, NOT_REDUNDANT = "redundant", "not_redundant"


# Every case evaluates the project's own float64 attention, written out for that case, so its
# outcome is an identity of that code, not a measurement that data could contradict: a `proof`
# check (the identity is the case's statement). The PyTorch quirk below runs PyTorch's own
# module and stays a test.
# A case whose effect is a term the code itself puts there (an explicit penalty, an explicit
# decay term, weights set to zero, slots or gates that bypass b_v) cannot come out otherwise for
# any data: its claim is a `consistency` check of the measurement, not evidence.
BY_CONSTRUCTION = "consistency"


@dataclass(frozen=True)
class Case:
    condition: str  # the group the paper's table lists it under
    variant: str
    quantity: str
    predicted: str
    statement: str  # the claim, as the paper states it
    kind: str = "proof"  # BY_CONSTRUCTION where the code guarantees the outcome


CASES = [
    Case("loss", "output-only", "gradient", REDUNDANT,
         "A loss that sees b_k only through the attention output gives b_k a zero gradient."),
    Case("loss", "l2-on-bk", "gradient", NOT_REDUNDANT,
         "An L2 regulariser on b_k gives b_k a non-zero gradient (the zero-gradient statement needs a loss that sees b_k only through the output).",
         BY_CONSTRUCTION),
    Case("optimizer", "adam", "adam_step", REDUNDANT,
         "Plain Adam leaves b_k in place to float64 rounding after one step (its gradient is zero)."),
    Case("optimizer", "adam-coupled-wd", "adam_step", NOT_REDUNDANT,
         "Adam with coupled weight_decay moves b_k by about one learning rate per step, because the decay term enters the gradient.",
         BY_CONSTRUCTION),
    Case("tied", "bq-equals-bk", "output", NOT_REDUNDANT,
         "A bias shared by the query and key projections (shared-QK attention) changes the output."),
    Case("scores", "temperature", "output", REDUNDANT,
         "A linear rescaling of the scores before softmax (a temperature) keeps b_k redundant."),
    Case("scores", "softcap", "output", NOT_REDUNDANT,
         "Logit soft-capping c*tanh(s/c) before softmax makes b_k change the output."),
    Case("fold", "plain", "fold", REDUNDANT,
         "Folding b_v into the output bias (b_o + W_o b_v) leaves the output unchanged in plain softmax attention."),
    Case("fold", "attention-dropout", "fold", NOT_REDUNDANT,
         "With attention dropout in training the rows of weights no longer sum to one and the b_v fold changes the output.",
         BY_CONSTRUCTION),
    Case("fold", "add-zero-attn", "fold", NOT_REDUNDANT,
         "With a value slot that carries no b_v (add_zero_attn) the b_v fold changes the output.",
         BY_CONSTRUCTION),
    Case("fold", "output-gate", "fold", NOT_REDUNDANT,
         "With a gate between attention and W_o the b_v fold changes the output.", BY_CONSTRUCTION),
    Case("fold", "fully-masked-row", "fold", NOT_REDUNDANT,
         "With a fully masked row whose weights are set to zero the b_v fold changes that row's output.",
         BY_CONSTRUCTION),
    Case("gate", "output-gate-bk", "output", REDUNDANT,
         "A gate between attention and W_o leaves b_k redundant (only the fold of b_v needs no gate)."),
    Case("relative", "relative-key", "output", REDUNDANT,
         "With relative_key position scores q_i.r_(i-j), b_k stays redundant."),
    Case("relative", "relative-key-query", "output", NOT_REDUNDANT,
         "With relative_key_query position scores (k_j.r_(i-j) added) b_k changes the output."),
    Case("relative", "deberta-c2p", "output", REDUNDANT,
         "DeBERTa's content-to-position term alone leaves b_k redundant."),
    Case("relative", "deberta-c2p-p2c", "output", NOT_REDUNDANT,
         "DeBERTa's position-to-content term (content keys times relative-position queries) makes b_k change the output."),
    Case("heads", "gqa", "output", REDUNDANT,
         "With grouped-query attention (key heads shared by several query heads) b_k stays redundant."),
    Case("heads", "mqa", "output", REDUNDANT,
         "With multi-query attention (one key head for all query heads) b_k stays redundant."),
    Case("rope", "partial-unrotated", "output", REDUNDANT,
         "With partial RoPE, the part of b_k in the unrotated dimensions stays redundant."),
    Case("rope", "partial-rotated", "output", NOT_REDUNDANT,
         "With partial RoPE, the part of b_k in the rotated dimensions changes the output."),
    Case("qknorm", "ln-key-bias", "output", REDUNDANT,
         "With LayerNorm QK-norm, the key norm's own bias is redundant."),
    Case("qknorm", "bk-before-ln", "output", NOT_REDUNDANT,
         "With LayerNorm QK-norm, b_k before the norm changes the output."),
]
CASE_BY_KEY = {(c.condition, c.variant): c for c in CASES}


def claim_id(case: Case) -> str:
    return f"cond-{case.condition}-{case.variant}"


def check_parameters(embed_dim: int, num_heads: int, seq_len: int, batch: int) -> None:
    """Refuse sizes the cases cannot use, before any work."""
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
    head_dim = embed_dim // num_heads
    if head_dim % 4:
        raise ValueError(f"head dimension embed_dim/num_heads={head_dim} must be a multiple of 4 (partial RoPE rotates half of it in pairs)")
    if num_heads < 2:
        raise ValueError("num_heads must be at least 2 so that grouped-query attention has a group")
    if seq_len < 2 or batch < 1:
        raise ValueError(f"seq_len={seq_len} must be >= 2 and batch={batch} >= 1")


# ---------------------------------------------------------------------------------------
# measure: an explicit float64 attention whose parts the cases switch on and off


def _weights(seed: int, embed_dim: int, num_heads: int, seq_len: int, batch: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    E, d = embed_dim, embed_dim // num_heads

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

    return {
        "x": randn(batch, seq_len, E),
        "w_q": randn(E, E, scale=E**-0.5), "w_k": randn(E, E, scale=E**-0.5),
        "w_v": randn(E, E, scale=E**-0.5), "w_o": randn(E, E, scale=E**-0.5),
        "w_g": randn(E, E, scale=E**-0.5),
        "b_q": randn(E), "b_k": randn(E), "b_v": randn(E), "b_o": randn(E),
        "delta": randn(E),  # the perturbation of whichever bias a case probes
        "rel": randn(2 * seq_len - 1, d, scale=d**-0.5),  # relative-position embeddings
        "w_qr": randn(d, d, scale=d**-0.5),  # DeBERTa's position-query projection
        "ln_w": 1.0 + 0.1 * randn(d), "ln_b": randn(d),
        "target": randn(batch, seq_len, E),
        "heads": num_heads,
    }


def _split(y: torch.Tensor, heads: int) -> torch.Tensor:
    B, L, E = y.shape
    return y.view(B, L, heads, E // heads).transpose(1, 2)


def _merge(o: torch.Tensor) -> torch.Tensor:
    B, H, L, d = o.shape
    return o.transpose(1, 2).reshape(B, L, H * d)


def _relative_index(L: int) -> torch.Tensor:
    idx = torch.arange(L)
    return idx[:, None] - idx[None, :] + L - 1  # position of r_(i-j) in the table


def _rotate_partial(t: torch.Tensor, rotated: int) -> torch.Tensor:
    """Rotary embedding (rotate-half form) on the first `rotated` dims of each head only."""
    L = t.shape[-2]
    half = rotated // 2
    freq = 10000.0 ** (-torch.arange(half, dtype=torch.float64) / half)
    angle = torch.arange(L, dtype=torch.float64)[:, None] * freq[None, :]
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    rot, keep = t[..., :rotated], t[..., rotated:]
    a, b = rot[..., :half], rot[..., half:]
    rot = rot * cos + torch.cat([-b, a], -1) * sin
    return torch.cat([rot, keep], -1)


def attention(
    w: dict,
    *,
    b_q=None, b_k=None, b_v=None, b_o=None,
    score_map: Callable[[torch.Tensor], torch.Tensor] | None = None,
    relative: str | None = None,
    kv_heads: int | None = None,
    rope_dims: int = 0,
    key_norm_bias=None,
    key_norm: bool = False,
    gate: bool = False,
    dropout: float = 0.0,
    dropout_seed: int = 0,
    zero_slot: bool = False,
    masked_row: bool = False,
) -> torch.Tensor:
    """One explicit float64 attention layer; each keyword switches on one departure from plain MHA.

    Biases default to those in `w`. `kv_heads` < heads shares key/value heads (GQA/MQA);
    `relative` adds relative-position scores ('relative_key', 'relative_key_query', 'c2p',
    'c2p_p2c'); `rope_dims` rotates that many leading dims of each head; `key_norm` applies a
    LayerNorm (weight ln_w, bias `key_norm_bias`) to each key head; `gate` multiplies the
    attention output by sigmoid(x W_g) before W_o; `zero_slot` appends a zero key and value
    (add_zero_attn); `masked_row` masks every key of query 0 and gives it zero weights.
    """
    b_q = w["b_q"] if b_q is None else b_q
    b_k = w["b_k"] if b_k is None else b_k
    b_v = w["b_v"] if b_v is None else b_v
    b_o = w["b_o"] if b_o is None else b_o
    x, H = w["x"], w["heads"]
    E = x.shape[-1]
    d = E // H
    G = kv_heads or H
    q = _split(x @ w["w_q"].T + b_q, H)
    k = _split(x @ w["w_k"][: G * d].T + b_k[: G * d], G)
    v = _split(x @ w["w_v"][: G * d].T + b_v[: G * d], G)
    if key_norm:
        bias = w["ln_b"] if key_norm_bias is None else key_norm_bias
        k = F.layer_norm(k, (d,), w["ln_w"], bias)
    if rope_dims:
        q, k = _rotate_partial(q, rope_dims), _rotate_partial(k, rope_dims)
    if G != H:
        k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
    if zero_slot:
        k = torch.cat([k, torch.zeros_like(k[..., :1, :])], -2)
        v = torch.cat([v, torch.zeros_like(v[..., :1, :])], -2)
    scores = q @ k.transpose(-1, -2)
    if relative:
        L = x.shape[1]
        r = w["rel"][_relative_index(L)]  # (L, L, d): r_(i-j)
        if relative in ("relative_key", "c2p", "relative_key_query", "c2p_p2c"):
            scores = scores + torch.einsum("bhid,ijd->bhij", q, r)
        if relative == "relative_key_query":
            scores = scores + torch.einsum("bhjd,ijd->bhij", k, r)
        if relative == "c2p_p2c":
            # position-to-content: content key k_j against the position query of (j - i)
            qr = w["rel"][_relative_index(L).T] @ w["w_qr"].T  # (L, L, d) indexed [i, j]
            scores = scores + torch.einsum("bhjd,ijd->bhij", k, qr)
    scores = scores / math.sqrt(d)
    if score_map is not None:
        scores = score_map(scores)
    if masked_row:
        mask = torch.zeros(scores.shape[-2:], dtype=torch.bool)
        mask[0] = True
        scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores, -1)
        # the convention of kernels that return zeros, not NaN, for a row with no key
        probs = torch.nan_to_num(probs, nan=0.0)
    else:
        probs = torch.softmax(scores, -1)
    if dropout:
        with torch.random.fork_rng():
            torch.manual_seed(dropout_seed)  # the same mask for the original and the folded call
            probs = F.dropout(probs, p=dropout, training=True)
    o = _merge(probs @ v)
    if gate:
        o = o * torch.sigmoid(x @ w["w_g"].T)
    return o @ w["w_o"].T + b_o


def _relative_change(new: torch.Tensor, old: torch.Tensor) -> float:
    scale = old.abs().max()
    return float((new - old).abs().max() / scale)


def _perturbed(w: dict, **kwargs) -> float:
    """Relative output change when b_k moves by `delta` (in the dims `dims`, default all)."""
    dims = kwargs.pop("dims", None)
    delta = w["delta"].clone()
    if dims is not None:
        keep = torch.zeros_like(delta)
        keep[dims] = 1.0
        delta = delta * keep
    base = attention(w, **kwargs)
    moved = attention(w, b_k=w["b_k"] + delta, **kwargs)
    return _relative_change(moved, base)


def _fold(w: dict, **kwargs) -> float:
    """Relative output change when b_v is folded into the output bias: b_o' = b_o + W_o b_v."""
    base = attention(w, **kwargs)
    folded = attention(w, b_v=torch.zeros_like(w["b_v"]), b_o=w["b_o"] + w["w_o"] @ w["b_v"], **kwargs)
    return _relative_change(folded, base)


def _gradient_ratio(w: dict, regulariser: float = 0.0) -> float:
    """||dL/db_k|| / ||dL/db_q|| for L = mean squared error of the output (+ regulariser |b_k|^2)."""
    b_q = w["b_q"].clone().requires_grad_(True)
    b_k = w["b_k"].clone().requires_grad_(True)
    loss = ((attention(w, b_q=b_q, b_k=b_k) - w["target"]) ** 2).mean() + regulariser * (b_k**2).sum()
    g_q, g_k = torch.autograd.grad(loss, (b_q, b_k))
    return float(g_k.norm() / g_q.norm())


def _adam_step(w: dict, weight_decay: float = 0.0) -> float:
    """max |b_k after - b_k before| / lr after one torch.optim.Adam step on all biases."""
    params = {name: w[name].clone().requires_grad_(True) for name in ("b_q", "b_k", "b_v", "b_o")}
    opt = torch.optim.Adam(params.values(), lr=ADAM_LR, eps=ADAM_EPS, weight_decay=weight_decay)
    loss = ((attention(w, **params) - w["target"]) ** 2).mean()
    loss.backward()
    before = params["b_k"].detach().clone()
    opt.step()
    return float((params["b_k"].detach() - before).abs().max() / ADAM_LR)


def _shared_bias(w: dict) -> float:
    """Relative output change when one bias, used by both the query and key projections, moves."""
    shared = w["b_k"]
    base = attention(w, b_q=shared, b_k=shared)
    moved = attention(w, b_q=shared + w["delta"], b_k=shared + w["delta"])
    return _relative_change(moved, base)


def _key_norm_bias(w: dict) -> float:
    base = attention(w, key_norm=True)
    moved = attention(w, key_norm=True, key_norm_bias=w["ln_b"] + w["delta"][: w["ln_b"].numel()])
    return _relative_change(moved, base)


def _head_dims(w: dict, rotated: bool) -> list[int]:
    """Indices of b_k (over every head) in the rotated or the unrotated part of each head."""
    E, H = w["x"].shape[-1], w["heads"]
    d = E // H
    r = d // 2
    return [h * d + i for h in range(H) for i in range(d) if (i < r) == rotated]


def measure_case(case: Case, w: dict, cfg: ConditionsConfig) -> float:
    """The effect of one case on one draw of weights (see QUANTITIES for its meaning), with the
    softcap, weight decay, regulariser and dropout of `cfg`."""
    softcap, weight_decay, regulariser, dropout = cfg.softcap, cfg.weight_decay, cfg.regulariser, cfg.dropout
    H = w["heads"]
    d = w["x"].shape[-1] // H
    key = (case.condition, case.variant)
    if key == ("loss", "output-only"):
        return _gradient_ratio(w)
    if key == ("loss", "l2-on-bk"):
        return _gradient_ratio(w, regulariser)
    if key == ("optimizer", "adam"):
        return _adam_step(w)
    if key == ("optimizer", "adam-coupled-wd"):
        return _adam_step(w, weight_decay)
    if key == ("tied", "bq-equals-bk"):
        return _shared_bias(w)
    if key == ("scores", "temperature"):
        return _perturbed(w, score_map=lambda s: s / 0.7)
    if key == ("scores", "softcap"):
        return _perturbed(w, score_map=lambda s: softcap * torch.tanh(s / softcap))
    if key == ("fold", "plain"):
        return _fold(w)
    if key == ("fold", "attention-dropout"):
        return _fold(w, dropout=dropout)
    if key == ("fold", "add-zero-attn"):
        return _fold(w, zero_slot=True)
    if key == ("fold", "output-gate"):
        return _fold(w, gate=True)
    if key == ("fold", "fully-masked-row"):
        return _fold(w, masked_row=True)
    if key == ("gate", "output-gate-bk"):
        return _perturbed(w, gate=True)
    if key == ("relative", "relative-key"):
        return _perturbed(w, relative="relative_key")
    if key == ("relative", "relative-key-query"):
        return _perturbed(w, relative="relative_key_query")
    if key == ("relative", "deberta-c2p"):
        return _perturbed(w, relative="c2p")
    if key == ("relative", "deberta-c2p-p2c"):
        return _perturbed(w, relative="c2p_p2c")
    if key == ("heads", "gqa"):
        return _perturbed(w, kv_heads=H // 2 if H % 2 == 0 else 1)
    if key == ("heads", "mqa"):
        return _perturbed(w, kv_heads=1)
    if key == ("rope", "partial-unrotated"):
        return _perturbed(w, rope_dims=d // 2, dims=_head_dims(w, rotated=False))
    if key == ("rope", "partial-rotated"):
        return _perturbed(w, rope_dims=d // 2, dims=_head_dims(w, rotated=True))
    if key == ("qknorm", "ln-key-bias"):
        return _key_norm_bias(w)
    if key == ("qknorm", "bk-before-ln"):
        return _perturbed(w, key_norm=True)
    raise ValueError(f"no measurement for case {key}")


def measure(cfg: ConditionsConfig, cases: list[Case] = CASES) -> pd.DataFrame:
    """One row per (case, seed of `cfg.seeds`): condition, variant, quantity, predicted, seed, effect."""
    rows = []
    for seed in cfg.seeds:
        w = _weights(seed, cfg.embed_dim, cfg.num_heads, cfg.seq_len, cfg.batch)
        for case in cases:
            effect = measure_case(case, w, cfg)
            rows.append({"condition": case.condition, "variant": case.variant,
                         "quantity": case.quantity, "predicted": case.predicted,
                         "seed": seed, "effect": effect})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------
# judge: pure functions of the measured frame


def bounds_for(case: Case) -> tuple[float, str, str]:
    """(bound, comparison, origin) that the case's prediction is judged against."""
    still, still_origin, moves, moves_origin, _ = QUANTITIES[case.quantity]
    if case.predicted == REDUNDANT:
        return still, "<=", still_origin
    return moves, ">=", moves_origin


def _reduce(effects: pd.Series, predicted: str, what: str) -> float:
    """Worst seed for the prediction: the largest effect of a redundant case, the smallest of a
    broken one. A non-finite effect or an empty selection gives NaN, which fails the claim."""
    values = pd.to_numeric(effects, errors="coerce")
    return finite_max(values, what) if predicted == REDUNDANT else finite_min(values, what)


def summary(frame: pd.DataFrame, cases: list[Case] = CASES) -> pd.DataFrame:
    """One row per case: the worst seed, its bound and the verdict (`redundant`/`not_redundant`)."""
    rows = []
    for case in cases:
        sel = frame[(frame["condition"] == case.condition) & (frame["variant"] == case.variant)]
        value = _reduce(sel["effect"], case.predicted, f"effect of {claim_id(case)} over seeds")
        bound, comparison, origin = bounds_for(case)
        still, _, moves, _, _ = QUANTITIES[case.quantity]
        if not math.isfinite(value):
            verdict = "undecided"
        elif value <= still:
            verdict = REDUNDANT
        elif value >= moves:
            verdict = NOT_REDUNDANT
        else:
            verdict = "undecided"
        rows.append({"condition": case.condition, "variant": case.variant, "quantity": case.quantity,
                     "predicted": case.predicted, "seeds": int(sel["seed"].nunique()),
                     "effect": value, "bound": bound, "comparison": comparison,
                     "verdict": verdict, "claim": claim_id(case)})
    return pd.DataFrame(rows)


def judge(frame: pd.DataFrame, cases: list[Case] = CASES) -> list[Claim]:
    """One claim per case (kind `Case.kind`): its worst seed is on the predicted side of its bound."""
    claims = []
    for row, case in zip(summary(frame, cases).itertuples(), cases, strict=True):
        bound, comparison, origin = bounds_for(case)
        claims.append(Claim(
            claim_id(case), f"{case.statement} (worst of {row.seeds} seeds, float64)",
            value=row.effect, bound=bound, comparison=comparison, kind=case.kind, bound_origin=origin,
            identity=case.statement if case.kind == "proof" else None,
        ))
    return claims


# ---------------------------------------------------------------------------------------
# the upstream reproducer (scripts/is_causal_need_weights_quirk.py)

QUIRK_SCRIPT = Path(__file__).resolve().parents[4] / "scripts" / "is_causal_need_weights_quirk.py"


def run_quirk_script(script: Path = QUIRK_SCRIPT, seed: int = 0) -> pd.DataFrame:
    """Run the standalone reproducer in a fresh interpreter and return its rows."""
    if not Path(script).is_file():
        raise FileNotFoundError(f"the upstream reproducer {script} is missing")
    done = subprocess.run([sys.executable, str(script), "--json", "--seed", str(seed)],
                          capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{script.name} failed ({done.returncode}): {done.stderr.strip()}")
    return pd.DataFrame(json.loads(done.stdout))


# option with appended slots -> (claim that need_weights changes the output, claim that
# need_weights=True gives the documented output)
QUIRK_CLAIM_IDS = (
    ("add_bias_kv", "cond-quirk-add-bias-kv-need-weights-changes-output",
     "cond-quirk-add-bias-kv-need-weights-true-documented"),
    ("add_zero_attn", "cond-quirk-add-zero-attn-need-weights-changes-output",
     "cond-quirk-add-zero-attn-need-weights-true-documented"),
)


def judge_quirk(rows: pd.DataFrame) -> list[Claim]:
    """Claims on the reproducer: with appended slots, need_weights changes the output and only
    need_weights=True matches the documented mask; without them, both paths agree."""
    def value(option: str, column: str) -> float:
        sel = rows.loc[rows["option"] == option, column]
        return float(sel.iloc[0]) if len(sel) == 1 else math.nan

    claims = []
    for option, changes_id, documented_id in QUIRK_CLAIM_IDS:
        claims.append(Claim(
            changes_id,
            f"With {option} and is_causal=True, nn.MultiheadAttention's output with need_weights=False differs from need_weights=True (the appended slot is hidden by SDPA's causal mask).",
            value=value(option, "max_abs_diff_need_weights"), bound=BREAK_MIN,
            comparison=">=", kind="test", bound_origin=BREAK_ORIGIN,
        ))
        claims.append(Claim(
            documented_id,
            f"With {option} and is_causal=True, need_weights=True gives the documented output (the given causal mask, padded for the extra slot) to float64 rounding.",
            value=value(option, "max_abs_diff_true_vs_reference"), bound=REDUNDANT_MAX,
            comparison="<=", kind="test", bound_origin=REDUNDANT_ORIGIN,
        ))
    claims.append(Claim(
        "cond-quirk-plain-paths-agree",
        "Without appended slots, need_weights=False and need_weights=True give the same output under is_causal=True, to float64 rounding.",
        value=value("plain", "max_abs_diff_need_weights"), bound=REDUNDANT_MAX,
        comparison="<=", kind="test", bound_origin=REDUNDANT_ORIGIN,
    ))
    return claims


# ---------------------------------------------------------------------------------------
# show


def table_latex(summary_frame: pd.DataFrame) -> str:
    """The paper's table of conditions: one row per case, with its prediction and verdict."""
    lines = [r"\begin{tabular}{llllll}", r"\toprule",
             r"condition & variant & measured & worst effect & bound & verdict \\", r"\midrule"]
    for r in summary_frame.itertuples():
        effect = "NaN" if not math.isfinite(r.effect) else f"${format_number(r.effect, 2)}$"
        comparison = r"\le" if r.comparison == "<=" else r"\ge"
        lines.append(
            f"{r.condition} & {r.variant} & {r.quantity.replace('_', ' ')} & {effect} & "
            f"${comparison} {format_number(r.bound, 1)}$ & {r.verdict.replace('_', ' ')} \\\\"
        )
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def effect_figure(summary_frame: pd.DataFrame):
    """Worst effect per case on a log axis, coloured by prediction, with each case's bound."""
    # deferred with `style`, which loads matplotlib: measuring and judging need no plotting library
    import matplotlib.pyplot as plt

    from keybias.studies import style

    style.apply()
    frame = summary_frame.reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(style.FULL_WIDTH, 0.16 * len(frame) + 0.9))
    floor = 1e-18  # exact zeros are drawn at the floor, not dropped
    colours = {REDUNDANT: style.OKABE_ITO[0], NOT_REDUNDANT: style.OKABE_ITO[3]}
    markers = {REDUNDANT: "o", NOT_REDUNDANT: "s"}
    for predicted in (REDUNDANT, NOT_REDUNDANT):
        sel = frame[frame["predicted"] == predicted]
        ax.scatter(sel["effect"].clip(lower=floor), sel.index, color=colours[predicted],
                   marker=markers[predicted], s=16, label=f"predicted {predicted.replace('_', ' ')}")
    # each case is judged against its own bound (Adam rows in learning rates), so mark it per row
    ax.scatter(frame["bound"], frame.index, marker="|", s=60, color=style.OKABE_ITO[7],
               label="bound of the case")
    ax.set_xscale("log")
    ax.set_yticks(frame.index, [f"{c}: {v}" for c, v in zip(frame["condition"], frame["variant"], strict=True)])
    ax.invert_yaxis()
    ax.set_xlabel("worst effect over seeds (relative change; Adam rows: learning rates per step)")
    style.legend_outside(fig, ncol=3)
    fig.tight_layout()
    return fig
