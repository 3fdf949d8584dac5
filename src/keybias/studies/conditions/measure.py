"""Exact conditions of the theorem beyond the assumption table: the measurement.

The theorem (notebook 01) says: when every score of query i moves by the same q_i.b_k, the
key bias changes nothing and its gradient is zero. This module checks, in float64, the cases
where that premise holds or fails in less obvious ways: losses that see b_k other than
through the output, optimizers that add their own term to the gradient, biases tied across
projections, score nonlinearities, relative-position terms that multiply the key, grouped
key heads, partial rotary embeddings, a LayerNorm on the keys, and the conditions under which
b_v folds into the output bias.

The study's layers: `cases` (what each case predicts, from algebra alone), this module
(`measure(cfg)`: one row per case and seed with the relative effect of perturbing the parameter
in question; `run_quirk_script`), `judge` (pure: frames in, claims out) and `show`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from keybias.studies.conditions.cases import CASES, Case
from keybias.studies.config import StudyConfig
from keybias.studies.fixtures import reference as R
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


ADAM_LR = 1e-3
ADAM_EPS = 1e-8

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


RELATIVE_KINDS = ("relative_key", "c2p", "relative_key_query", "c2p_p2c")


def _relative_index(L: int) -> torch.Tensor:
    idx = torch.arange(L)
    return idx[:, None] - idx[None, :] + L - 1  # position of r_(i-j) in the table


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
    params = {"w_q": w["w_q"], "w_k": w["w_k"], "w_v": w["w_v"], "w_o": w["w_o"],
              "b_q": w["b_q"] if b_q is None else b_q, "b_k": w["b_k"] if b_k is None else b_k,
              "b_v": w["b_v"] if b_v is None else b_v, "b_o": w["b_o"] if b_o is None else b_o}
    x = w["x"]
    d = x.shape[-1] // w["heads"]
    hooks = R.Hooks(keys=_keys_hook(w, d, key_norm, key_norm_bias, rope_dims, zero_slot),
                    logits=_relative_hook(w, relative, x.shape[1]),
                    scores=score_map,
                    normalise=_softmax_empty_rows_zero if masked_row else R.softmax,
                    weights=_dropout_hook(dropout, dropout_seed) if dropout else None,
                    merged=(lambda o: o * torch.sigmoid(x @ w["w_g"].T)) if gate else None)
    mask = None
    if masked_row:
        n_keys = x.shape[1] + int(zero_slot)
        mask = torch.zeros(x.shape[1], n_keys, dtype=torch.bool)
        mask[0] = True
    return R.attention(x, x, params, num_heads=w["heads"], hooks=hooks, mask=mask, kv_heads=kv_heads)


def _keys_hook(w: dict, d: int, key_norm: bool, key_norm_bias, rope_dims: int, zero_slot: bool):
    if not (key_norm or rope_dims or zero_slot):
        return None

    def keys(q, k, v):
        if key_norm:
            k = F.layer_norm(k, (d,), w["ln_w"], w["ln_b"] if key_norm_bias is None else key_norm_bias)
        if rope_dims:
            q, k = R.rope_half(q, rope_dims), R.rope_half(k, rope_dims)
        if zero_slot:
            zero = torch.zeros(k.shape[1], d, dtype=k.dtype)
            k, v = R.append_slot(k, v, zero, zero)
        return q, k, v
    return keys


def _relative_hook(w: dict, relative: str | None, n: int):
    """Relative-position terms of the unscaled logits: q_i . r_(i-j) (Shaw et al.), k_j . r_(i-j),
    and DeBERTa's position-to-content k_j . W_qr r_(j-i)."""
    if not relative:
        return None
    if relative not in RELATIVE_KINDS:
        raise ValueError(f"relative={relative!r} unknown; allowed: {list(RELATIVE_KINDS)}")
    r = w["rel"][_relative_index(n)]  # (L, L, d): r_(i-j)

    def logits(s, q, k):
        s = s + torch.einsum("bhid,ijd->bhij", q, r)
        if relative == "relative_key_query":
            s = s + torch.einsum("bhjd,ijd->bhij", k, r)
        if relative == "c2p_p2c":
            qr = w["rel"][_relative_index(n).T] @ w["w_qr"].T  # (L, L, d) indexed [i, j]
            s = s + torch.einsum("bhjd,ijd->bhij", k, qr)
        return s
    return logits


def _softmax_empty_rows_zero(s: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    # the convention of kernels that return zeros, not NaN, for a row with no key
    return torch.nan_to_num(R.softmax(s, mask), nan=0.0)


def _dropout_hook(p: float, seed: int):
    def weights(probs):
        with torch.random.fork_rng():
            torch.manual_seed(seed)  # the same mask for the original and the folded call
            return F.dropout(probs, p=p, training=True)
    return weights


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


