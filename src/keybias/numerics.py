"""The key bias in floating point: the output change it causes, the accuracy it costs,
and its gradient, measured per dtype and per code path, against a first-order rounding model.

In exact arithmetic the key bias b_k only adds c_i = q_i . b_k / sqrt(d) to every score of
query row i, and softmax ignores a shift shared by a whole row. In floating point the shift
is not free: the scores are formed and stored at a magnitude |s_ij| ~ |c_i| instead of O(1),
so they carry rounding errors of size ~u |c_i| that differ from key to key, and those do
change the softmax. The first-order model (`rounding_model`) counts, for one run,

* forming k_j + b_k in working precision: relative error of std rho*u per entry, so the
  score q_i . (k_j + b_k) / sqrt(d) moves by a variance rho^2 u^2 sum_t q_it^2 (k_jt + b_t)^2 / d;
* storing the score s_ij in working precision: variance rho^2 u^2 s_ij^2;
* rounding the weights p_ij and the output y_i (these do not grow with b_k: the floor).

rho = sqrt(1 / (8 ln 2)) ~= 0.42 is the standard deviation of round-to-nearest error in units
of u |x| when the mantissa of x is log-uniform. A score error e_ij moves the output row by
delta y_i = sum_j p_ij e_ij (v_j - y_i), so independent errors give

    E |delta y_ic|^2 = sum_j p_ij^2 sigma_ij^2 (v_jc - y_ic)^2 + floor terms.

The model assumes the inner products are accumulated in higher precision or in blocks (true
for the CPU kernels of half types, roughly true for blocked float32/float64 GEMMs). Since every
b_k-dependent term is proportional to |b_k|, the law is delta ~ C u |b_k| for |b_k| >> |k|:
slope 1 in log-log, with a constant C that `fit_law` measures per dtype and path.

Gradient. In exact arithmetic dL/db_k = sum_i q_i (sum_j ds_ij) / sqrt(d) = 0 because each
row of the softmax Jacobian sums to zero; in floating point the row sums are rounding errors,
so the gradient is noise of size ~u (see keybias.verdict for the bound).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from keybias import verdict
from keybias.claims import finite_max, finite_min
from keybias.params import DTYPES, Param

# Code paths: the attention product written out, F.scaled_dot_product_attention with each
# backend that runs on CPU, and nn.MultiheadAttention (b_k enters through the in-projection).
PATHS = ("explicit", "sdpa_math", "sdpa_flash", "sdpa_efficient", "mha")
_SDPA_BACKENDS = {
    "sdpa_math": SDPBackend.MATH,
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
}
DEVICES = ("cpu", "cuda", "mps")
TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}
# Std of round-to-nearest error in units of u|x| for a log-uniform mantissa.
RHO = math.sqrt(1.0 / (8.0 * math.log(2.0)))
# Law fit (method constants, printed in the paper as macros): fit where the change is at
# least DOMINANCE times the measured floor (subtracting the floor is well conditioned) and
# the RMS predicted score-error std is at most VALIDITY (first-order model valid); the floor
# is the median change over magnitudes |b_k|/|k| <= FLOOR_RATIO.
DOMINANCE = 3.0
VALIDITY = 0.1
FLOOR_RATIO = 0.1
# Error growth that defines the accuracy crossing ("the error doubles").
CROSSING_FACTOR = 2.0
# Margin of the slope-1 law, fixed before the data: over the fitted range the first-order
# model drops terms of relative size up to VALIDITY, so a slope within VALIDITY of 1 agrees
# with the model. A true deviation beyond SLOPE_MARGIN + z SE fails the claim with
# probability at least 1 - p/2: that is the smallest deviation the claim detects.
SLOPE_MARGIN = VALIDITY
# dtype -> the spelled-out suffix of per-dtype macro names.
DTYPE_MACRO = {"float64": "FloatSixtyFour", "float32": "FloatThirtyTwo",
               "bfloat16": "BfloatSixteen", "float16": "FloatSixteen"}

PARAMETERS: dict[str, Param] = {
    "dtypes": Param(str, many=True, choices=DTYPES, help="working precisions"),
    "paths": Param(str, many=True, choices=PATHS, help="attention code paths"),
    "head_dim": Param(int, minimum=2, maximum=512, help="d, dimension per head"),
    "num_heads": Param(int, positive=True, maximum=16),
    "seq_len": Param(int, minimum=2, maximum=1024, help="n, keys (= queries) per sequence"),
    "batch": Param(int, positive=True, maximum=256, help="sequences per measurement"),
    "ratio_log10_min": Param(float, minimum=-8, maximum=4, help="smallest log10 |b_k|/|k|"),
    "ratio_log10_max": Param(float, minimum=-8, maximum=4, help="largest log10 |b_k|/|k|"),
    "ratio_points": Param(int, minimum=3, maximum=200, help="magnitudes on the log grid"),
    "grad_batches": Param(int, minimum=3, maximum=512, help="independent batches for gradients"),
    "seed": Param(int, minimum=0),
    "calibration_seed": Param(int, minimum=0, help="seed of the held-out run that calibrates the crossing prediction"),
}


# ----------------------------------------------------------------------------- validation
def _check_choices(name: str, values, allowed) -> list:
    values = [values] if isinstance(values, str) else list(values)
    if not values:
        raise ValueError(f"{name} must be a non-empty list; allowed: {list(allowed)}")
    for v in values:
        if v not in allowed:
            raise ValueError(f"{name}: {v!r} is not allowed; allowed: {list(allowed)}")
    return values


def _check_size(name: str, value, minimum: int = 1, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum or (
        maximum is not None and value > maximum
    ):
        hi = f" and <= {maximum}" if maximum is not None else ""
        raise ValueError(f"{name} must be an integer >= {minimum}{hi}, got {value!r}")
    return int(value)


def bias_ratios(log10_min: float, log10_max: float, points: int) -> np.ndarray:
    """The log grid of |b_k| / |k| (|k| = mean key-row norm)."""
    if not (math.isfinite(log10_min) and math.isfinite(log10_max)) or log10_min >= log10_max:
        raise ValueError(f"ratio_log10_min ({log10_min}) must be < ratio_log10_max ({log10_max})")
    _check_size("ratio_points", points, 3)
    return np.logspace(log10_min, log10_max, points)


# ----------------------------------------------------------------------------- attention
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, path: str) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v on tensors of shape (batch, heads, n, d) by one code path
    ("explicit", "sdpa_math", "sdpa_flash"); computed in the tensors' dtype."""
    if path == "explicit":
        scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        return torch.softmax(scores, dim=-1) @ v
    if path in _SDPA_BACKENDS:
        with sdpa_kernel(_SDPA_BACKENDS[path]):
            return F.scaled_dot_product_attention(q, k, v)
    raise ValueError(f"path {path!r} is not an attention-core path; allowed: {list(_SDPA_BACKENDS) + ['explicit']}")


def make_mha(embed_dim: int, num_heads: int, seed: int) -> torch.nn.MultiheadAttention:
    """A float64 nn.MultiheadAttention with PyTorch's default init (biases zero), fixed seed."""
    torch.manual_seed(seed)
    mha = torch.nn.MultiheadAttention(embed_dim, num_heads, batch_first=True, dtype=torch.float64)
    return mha.eval()


def _split_heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    b, n, e = t.shape
    return t.reshape(b, n, num_heads, e // num_heads).transpose(1, 2)


def mha_projections(mha: torch.nn.MultiheadAttention, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """q, k, v per head (batch, heads, n, d) of self-attention on x, in float64 with b_k = 0."""
    e = mha.embed_dim
    w = mha.in_proj_weight.detach().double()
    bias = mha.in_proj_bias.detach().double()
    x = x.double()
    out = {}
    for i, name in enumerate("qkv"):
        b = bias[i * e:(i + 1) * e] if name != "k" else torch.zeros(e, dtype=torch.float64)
        out[name] = _split_heads(x @ w[i * e:(i + 1) * e].T + b, mha.num_heads)
    return out


def _mha_forward(mha: torch.nn.MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    return mha(x, x, x, need_weights=False)[0]


# ----------------------------------------------------------------------------- rounding model
def rounding_model(q, k, v, b, dtype) -> dict[str, float]:
    """First-order rounding model (see module doc) for one run of attention(q, k + b, v).

    q, k, v: float64 tensors (batch, heads, n, d); b: float64 tensor broadcastable to k
    (the key bias, per head; all zero means k is used as given, with no forming error).
    Returns the predicted mean squared output error per entry from the score errors
    ("score") and from rounding p and y ("floor"), and the largest and RMS predicted
    score-error std ("score_std_max", "score_std_rms"; first-order validity needs << 1).
    """
    u = verdict.unit_roundoff(dtype)
    q, k, v, b = (t.double() for t in (q, k, v, b))
    kb = k + b
    d = q.shape[-1]
    s = (q @ kb.transpose(-2, -1)) / math.sqrt(d)
    p = torch.softmax(s, dim=-1)
    y = p @ v
    # forming k + b: score variance rho^2 u^2 sum_t q_it^2 (k_jt + b_t)^2 / d (none if b == 0)
    forming = (q**2) @ (kb**2).transpose(-2, -1) / d if bool(torch.any(b != 0)) else torch.zeros_like(s)
    sigma2 = (RHO * u) ** 2 * (forming + s**2)
    p2 = p**2
    # sum_j p_ij^2 sigma_ij^2 (v_jc - y_ic)^2 = A v^2 - 2 y (A v) + y^2 A 1, with A = p^2 sigma^2
    a = p2 * sigma2
    score_part = a @ v**2 - 2 * y * (a @ v) + y**2 * a.sum(-1, keepdim=True)
    floor_part = (RHO * u) ** 2 * (p2 @ v**2 + y**2)
    return {
        "score": float(score_part.mean()),
        "floor": float(floor_part.mean()),
        "score_std_max": float(torch.sqrt(sigma2.max())),
        "score_std_rms": float(torch.sqrt(sigma2.mean())),
    }


def predicted_change(q, k, v, b, dtype, *, out_gain: float = 1.0, without: dict | None = None) -> dict[str, float]:
    """Predicted RMS of y(b) - y(0) per entry (the two runs round independently), its part
    that grows with b and the rest (floor). out_gain multiplies an entry's std (an output
    projection); `without` may pass rounding_model(..., b = 0, ...) to reuse it."""
    with_b = rounding_model(q, k, v, b, dtype)
    if without is None:
        without = rounding_model(q, k, v, torch.zeros_like(b), dtype)
    grow = max(with_b["score"] - without["score"], 0.0)
    total = with_b["score"] + with_b["floor"] + without["score"] + without["floor"]
    return {
        "pred_rms": out_gain * math.sqrt(total),
        "pred_bias_rms": out_gain * math.sqrt(grow),
        "pred_floor_rms": out_gain * math.sqrt(total - grow),
        "score_std_max": with_b["score_std_max"],
        "score_std_rms": with_b["score_std_rms"],
    }


# ----------------------------------------------------------------------------- data
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def random_qkv(batch: int, num_heads: int, seq_len: int, head_dim: int, seed: int):
    """q, k ~ N(0, 1); v = (k + N(0, 1)) / sqrt(2) (values tied to keys, as projections of one
    input are, so the b_q gradient has a consistent direction); float64."""
    g = _gen(seed)
    shape = (batch, num_heads, seq_len, head_dim)
    q = torch.randn(shape, generator=g, dtype=torch.float64)
    k = torch.randn(shape, generator=g, dtype=torch.float64)
    v = (k + torch.randn(shape, generator=g, dtype=torch.float64)) / math.sqrt(2.0)
    return q, k, v


def _direction(num_heads: int, head_dim: int, seed: int) -> torch.Tensor:
    """A fixed random unit direction per head, shape (1, heads, 1, d)."""
    g = _gen(seed + 7919)
    b = torch.randn(1, num_heads, 1, head_dim, generator=g, dtype=torch.float64)
    return b / b.norm(dim=-1, keepdim=True)


# ----------------------------------------------------------------------------- part 1 and 2
def _available(path: str, dtype: str, device: str) -> str | None:
    """None if `path` runs with `dtype` on `device`, else the reason it does not."""
    if path not in _SDPA_BACKENDS:
        return None
    t = torch.zeros(1, 1, 2, 8, dtype=TORCH_DTYPES[dtype], device=device)
    try:
        attention(t, t, t, path)
    except RuntimeError as exc:
        return f"no {device} kernel for {dtype} ({type(exc).__name__})"
    return None


def _check_device(device: str) -> str:
    if device not in DEVICES:
        raise ValueError(f"device {device!r} is unknown; allowed: {list(DEVICES)}")
    from keybias.params import devices_present

    if not devices_present()[device]:
        raise ValueError(f"device {device!r} is not present here; run with device='cpu'")
    return device


def _check_common(dtypes, paths, head_dim, num_heads, seq_len, batch, device):
    return (
        _check_choices("dtypes", dtypes, DTYPES), _check_choices("paths", paths, PATHS),
        _check_size("head_dim", head_dim, 2), _check_size("num_heads", num_heads, 1),
        _check_size("seq_len", seq_len, 2), _check_size("batch", batch, 1), _check_device(device),
    )


def _mha_setting(e, num_heads, batch, seq_len, seed, dtype, device):
    """nn.MultiheadAttention in `dtype` on `device`, its input x, and float64 projections."""
    tdt = TORCH_DTYPES[dtype]
    mha64 = make_mha(e, num_heads, seed)
    x = torch.randn(batch, seq_len, e, generator=_gen(seed + 1), dtype=torch.float64).to(tdt)
    proj = mha_projections(mha64, x.double())
    return mha64, make_mha(e, num_heads, seed).to(device=device, dtype=tdt), x.to(device), proj


def error_sweep(
    dtypes, paths, *, head_dim: int, num_heads: int, seq_len: int, batch: int,
    ratios, seed: int = 0, device: str = "cpu", progress: bool = False,
) -> pd.DataFrame:
    """Output change caused by b_k and output accuracy, per dtype, path and |b_k|/|k|.

    b_k = r * mean_j |k_j| * (a fixed random unit direction per head). Columns:
    delta_rms, delta_rel, delta_max: y(b_k) - y(0), both in the same dtype and path
    (RMS, RMS relative to RMS(y_ref), max abs entry); err_rms and err0_rms: RMS of
    y(b_k) - y_ref and of y(0) - y_ref relative to RMS(y_ref), where y_ref is float64
    attention without b_k on the same rounded inputs (exact up to float64 rounding, by
    shift invariance); pred_* from `predicted_change` (evaluated in float64 on the
    unrounded inputs, scaled by u^2); tolerance: keybias.verdict.output_tolerance for the
    largest entry of the change (for "mha" mapped through out_proj, see below).
    """
    dtypes, paths, head_dim, num_heads, seq_len, batch, device = _check_common(
        dtypes, paths, head_dim, num_heads, seq_len, batch, device)
    ratios = np.asarray(ratios, dtype=float)
    if ratios.ndim != 1 or ratios.size == 0 or not np.all(np.isfinite(ratios)) or np.any(ratios <= 0):
        raise ValueError(f"ratios must be a non-empty list of positive numbers, got {ratios!r}")
    from tqdm import tqdm

    e = head_dim * num_heads
    direction = _direction(num_heads, head_dim, seed)
    model_cache: dict = {}
    rows = []
    jobs = [(dt, p) for dt in dtypes for p in paths]
    for dtype, path in tqdm(jobs, desc="precision sweep", disable=not progress):
        tdt = TORCH_DTYPES[dtype]
        u = verdict.unit_roundoff(dtype)
        reason = _available(path, dtype, device)
        kind = "mha" if path == "mha" else "core"
        if path == "mha":
            mha64, mha, x_d, proj = _mha_setting(e, num_heads, batch, seq_len, seed, dtype, device)
            q64, k64, v64 = proj["q"], proj["k"], proj["v"]
            clean = mha_projections(mha64, torch.randn(batch, seq_len, e, generator=_gen(seed + 1),
                                                       dtype=torch.float64))
            w_o = mha64.out_proj.weight.detach()
            gain = float(w_o.norm() / math.sqrt(e))  # RMS gain of out_proj on independent errors
            gain_inf = float(w_o.abs().sum(1).max())  # max-norm gain, for the rigorous bound
            with torch.no_grad():
                y_ref = _mha_forward(mha64, x_d.double().cpu())
                y0 = _mha_forward(mha, x_d).double().cpu()
        else:
            clean = dict(zip("qkv", random_qkv(batch, num_heads, seq_len, head_dim, seed), strict=True))
            q_d, k_d, v_d = (clean[n].to(device=device, dtype=tdt) for n in "qkv")
            q64, k64, v64 = (t.double().cpu() for t in (q_d, k_d, v_d))
            gain = gain_inf = 1.0
            y_ref = attention(q64, k64, v64, "explicit")
            y0 = attention(q_d, k_d, v_d, path).double().cpu() if reason is None else None
        k_norm = float(clean["k"].norm(dim=-1).mean())
        ref_rms = float(y_ref.pow(2).mean().sqrt())
        err0 = float((y0 - y_ref).pow(2).mean().sqrt()) / ref_rms if y0 is not None else math.nan
        for r in ratios:
            b64 = direction * (r * k_norm)
            row = {
                "device": device, "dtype": dtype, "path": path, "ratio": float(r),
                "bias_norm": float(b64.norm(dim=-1).mean()), "key_norm": k_norm,
                "unit_roundoff": u, "head_dim": head_dim, "num_heads": num_heads,
                "seq_len": seq_len, "batch": batch, "seed": seed,
            }
            if reason is not None:
                rows.append({**row, "status": "not run", "reason": reason})
                continue
            with torch.no_grad():
                b_d = b64.to(device=device, dtype=tdt)
                if path == "mha":
                    mha.in_proj_bias[e:2 * e] = b_d.reshape(e)
                    y1 = _mha_forward(mha, x_d).double().cpu()
                    mha.in_proj_bias[e:2 * e] = 0
                else:
                    y1 = attention(q_d, k_d + b_d, v_d, path).double().cpu()
            key = (kind, float(r))
            if key not in model_cache:  # every predicted std is proportional to u: evaluate once
                base = model_cache.setdefault((kind, "zero"), rounding_model(
                    clean["q"], clean["k"], clean["v"], torch.zeros_like(b64), "float64"))
                model_cache[key] = predicted_change(clean["q"], clean["k"], clean["v"], b64, "float64",
                                                    without=base)
            pred64 = model_cache[key]
            scale = u / verdict.unit_roundoff("float64")
            pred = {n: (val * scale * gain if n.startswith("pred") else val * scale)
                    for n, val in pred64.items()}
            kb = k64 + b_d.double().cpu()
            score_abs = float(((q64.abs() @ kb.abs().transpose(-2, -1)) / math.sqrt(head_dim)).max())
            tol = verdict.output_tolerance(dtype, head_dim=head_dim, n_keys=seq_len,
                                           score_abs_max=score_abs, value_abs_max=float(v64.abs().max()))
            if path == "mha":  # through out_proj: its max-norm, plus its own rounding in both runs
                core_abs = float(attention(q64, kb, v64, "explicit").abs().max())
                tol = gain_inf * (tol + 2 * verdict.LAMBDA * math.sqrt(e) * u * core_abs)
            delta = y1 - y0
            rows.append({
                **row, "status": "ok", "reason": "",
                "delta_rms": float(delta.pow(2).mean().sqrt()),
                "delta_rel": float(delta.pow(2).mean().sqrt()) / ref_rms,
                "delta_max": float(delta.abs().max()),
                "err_rms": float((y1 - y_ref).pow(2).mean().sqrt()) / ref_rms,
                "err0_rms": err0, "ref_rms": ref_rms, **pred, "tolerance": tol,
                "finite": bool(torch.isfinite(y1).all()),
            })
    return pd.DataFrame(rows)


def add_floor(df: pd.DataFrame, floor_ratio: float = FLOOR_RATIO) -> pd.DataFrame:
    """Add the measured floor of each (dtype, path): the median delta_rms over magnitudes
    <= floor_ratio (the smallest one if none), and delta_bias_rms = sqrt(delta^2 - floor^2),
    the part of the change that the key bias adds (NaN where delta <= floor)."""
    out = df.copy()
    out["floor_rms"] = math.nan
    ok = out["status"].eq("ok")
    for _, g in out[ok].groupby(["dtype", "path"], sort=False):
        low = g[g["ratio"] <= floor_ratio]
        low = low if len(low) else g.nsmallest(1, "ratio")
        out.loc[g.index, "floor_rms"] = float(low["delta_rms"].median())
    excess = out["delta_rms"] ** 2 - out["floor_rms"] ** 2
    out["delta_bias_rms"] = np.sqrt(excess.where(excess > 0))
    return out


def fit_mask(df: pd.DataFrame, *, dominance: float = DOMINANCE, validity: float = VALIDITY) -> pd.Series:
    """Rows where the law is fitted: the change exceeds `dominance` times the measured floor
    (so subtracting the floor is well conditioned) and the first-order model is valid
    (RMS predicted score-error std at most `validity`)."""
    if "floor_rms" not in df:
        raise ValueError("call add_floor(df) first")
    ok = df["status"].eq("ok") & df["delta_bias_rms"].gt(0)
    return ok & (df["delta_rms"] >= dominance * df["floor_rms"]) & (df["score_std_rms"] <= validity)


def _linear_fit(x: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None) -> dict[str, float]:
    """Least squares y = alpha x + intercept(group); alpha, its standard error and the
    residual std. One intercept per distinct group label (a common slope)."""
    labels = np.zeros(len(x), dtype=int) if groups is None else pd.factorize(groups)[0]
    k = labels.max() + 1
    design = np.column_stack([x] + [(labels == i).astype(float) for i in range(k)])
    n = len(x)
    if n < k + 2 or np.ptp(x) == 0:
        return {"slope": math.nan, "slope_se": math.nan, "resid_log10": math.nan,
                "intercepts": [math.nan] * k, "points": n}
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ coef
    s2 = float(resid @ resid) / (n - k - 1)
    cov = s2 * np.linalg.inv(design.T @ design)
    return {"slope": float(coef[0]), "slope_se": float(math.sqrt(cov[0, 0])),
            "resid_log10": float(math.sqrt(s2)), "intercepts": coef[1:].tolist(), "points": n}


def fit_law(df: pd.DataFrame, *, mask: pd.Series | None = None) -> pd.DataFrame:
    """The law delta_bias = A (|b_k|/|k|)^alpha, fitted by least squares in log10 per dtype
    and path on the rows of `fit_mask` (df from `add_floor`). Also the model constant
    C = geometric mean of delta_rms / pred_rms on those rows and its scatter (log10)."""
    mask = fit_mask(df) if mask is None else mask
    rows = []
    for (dtype, path), g in df[mask].groupby(["dtype", "path"], sort=False):
        x = np.log10(g["ratio"].to_numpy())
        y = np.log10(g["delta_bias_rms"].to_numpy())
        fit = _linear_fit(x, y)
        c = np.log10(g["delta_rms"].to_numpy() / g["pred_rms"].to_numpy())
        rows.append({
            "dtype": dtype, "path": path, "points": fit["points"],
            "slope": fit["slope"], "slope_se": fit["slope_se"],
            "const": 10 ** fit["intercepts"][0], "const_over_u": 10 ** fit["intercepts"][0] / verdict.unit_roundoff(dtype),
            "resid_log10": fit["resid_log10"],
            "model_constant": float(10 ** c.mean()),
            "model_scatter_log10": float(c.std(ddof=1)) if len(c) > 1 else math.nan,
            "ratio_min": float(g["ratio"].min()), "ratio_max": float(g["ratio"].max()),
        })
    return pd.DataFrame(rows)


def pooled_slope(df: pd.DataFrame, *, mask: pd.Series | None = None) -> pd.DataFrame:
    """Per dtype, one common slope over all paths (an intercept per path), with its SE,
    `slope_dev` = |slope - 1| (judged against the fixed SLOPE_MARGIN) and `detectable_dev`
    = SLOPE_MARGIN + z SE, the smallest true deviation the judgement detects with
    probability 1 - p/2. `second_order` is the largest RMS score-error std in the fitted
    range, the relative size of the terms the model drops."""
    mask = fit_mask(df) if mask is None else mask
    rows = []
    for dtype, g in df[mask].groupby("dtype", sort=False):
        fit = _linear_fit(np.log10(g["ratio"].to_numpy()), np.log10(g["delta_bias_rms"].to_numpy()),
                          g["path"].to_numpy())
        # the first-order model drops terms of relative size ~ sigma (score-error std); over the
        # fitted range they can tilt the slope by up to the largest sigma present there
        second_order = float(g["score_std_rms"].max())
        rows.append({"dtype": dtype, "points": fit["points"], "slope": fit["slope"],
                     "slope_se": fit["slope_se"], "resid_log10": fit["resid_log10"],
                     "second_order": second_order,
                     "slope_dev": abs(fit["slope"] - 1),
                     "detectable_dev": SLOPE_MARGIN + normal_quantile() * fit["slope_se"]})
    return pd.DataFrame(rows)


def accuracy_crossing(df: pd.DataFrame, law: pd.DataFrame, factor: float = CROSSING_FACTOR) -> pd.DataFrame:
    """Per dtype and path, the smallest |b_k|/|k| where the error against the float64
    reference exceeds `factor` times the error with b_k = 0 (log-interpolated on the grid),
    and the crossing that the calibrated model predicts: the run with b_k has error
    sqrt(e0^2 + (C * pred_bias(r))^2), with pred_bias the model's b_k-dependent part
    (forming k + b_k and storing the scores, which at small r is not yet linear in r) and C
    the fitted model constant of that dtype and path."""
    law = law.set_index(["dtype", "path"])
    rows = []
    for (dtype, path), g in df[df["status"].eq("ok")].groupby(["dtype", "path"], sort=False):
        g = g.sort_values("ratio")
        err0 = float(g["err0_rms"].iloc[0])
        r = g["ratio"].to_numpy()
        rec = {"dtype": dtype, "path": path, "err0_rms": err0, "factor": factor}
        rec["crossing"] = _crossing(r, g["err_rms"].to_numpy(), factor * err0) if err0 > 0 else math.nan
        pred = math.nan
        if (dtype, path) in law.index and err0 > 0:
            c = float(law.loc[(dtype, path), "model_constant"])
            grow = c * g["pred_bias_rms"].to_numpy() / g["ref_rms"].to_numpy()
            fine = np.geomspace(r[0], r[-1], 50 * len(r))
            curve = np.sqrt(err0**2 + np.interp(np.log(fine), np.log(r), grow) ** 2)
            pred = _crossing(fine, curve, factor * err0)
        rec["crossing_pred"] = pred
        rows.append(rec)
    return pd.DataFrame(rows)


def _crossing(x: np.ndarray, y: np.ndarray, level: float) -> float:
    above = np.nonzero(y >= level)[0]
    if above.size == 0 or not math.isfinite(level):
        return math.nan
    i = int(above[0])
    if i == 0:
        return float(x[0])
    lx0, lx1 = math.log10(x[i - 1]), math.log10(x[i])
    ly0, ly1, ll = (math.log10(max(t, 1e-300)) for t in (y[i - 1], y[i], level))
    t = (ll - ly0) / (ly1 - ly0) if ly1 != ly0 else 1.0
    return float(10 ** (lx0 + t * (lx1 - lx0)))


# ----------------------------------------------------------------------------- part 3
def _core_grads(q, k, v, dy, path):
    """(g_bq, g_bk) of sum(y * dy), y = attention(q + b_q, k + b_k, v), at b_q = b_k = 0."""
    h, d = q.shape[1], q.shape[-1]
    b_q = torch.zeros(1, h, 1, d, dtype=q.dtype, device=q.device, requires_grad=True)
    b_k = torch.zeros(1, h, 1, d, dtype=q.dtype, device=q.device, requires_grad=True)
    y = attention(q + b_q, k + b_k, v, path)
    (y * dy).sum().backward()
    return b_q.grad.double().cpu().reshape(-1), b_k.grad.double().cpu().reshape(-1)


def gradient_sweep(
    dtypes, paths, *, head_dim: int, num_heads: int, seq_len: int, batch: int,
    batches: int, seed: int = 0, device: str = "cpu", progress: bool = False,
) -> pd.DataFrame:
    """Gradients of b_q and b_k (at b_k = 0) over `batches` independent batches, per dtype
    and path (forward and backward in that dtype). Loss sum(y * dy) with dy = w + noise for
    a fixed w, and v tied to k (`random_qkv`), so the b_q gradient has a consistent
    direction; for "mha": sum(out * dout) of nn.MultiheadAttention self-attention on
    x ~ N(0, 1), dout = w + noise. One row per (dtype, path, batch index) with the norms,
    the vectors (columns g_bq, g_bk, lists) and keybias.verdict.gradient_tolerance for
    the largest b_k gradient entry."""
    dtypes, paths, head_dim, num_heads, seq_len, batch, device = _check_common(
        dtypes, paths, head_dim, num_heads, seq_len, batch, device)
    batches = _check_size("batches", batches, 3)
    from tqdm import tqdm

    e = head_dim * num_heads
    w = torch.randn(1, num_heads, 1, head_dim, generator=_gen(seed + 31), dtype=torch.float64)
    w_out = torch.randn(1, 1, e, generator=_gen(seed + 37), dtype=torch.float64)
    rows = []
    jobs = [(dt, p) for dt in dtypes for p in paths]
    for dtype, path in tqdm(jobs, desc="gradient sweep", disable=not progress):
        tdt = TORCH_DTYPES[dtype]
        u = verdict.unit_roundoff(dtype)
        reason = _available(path, dtype, device)
        base = {"device": device, "dtype": dtype, "path": path, "unit_roundoff": u,
                "head_dim": head_dim, "num_heads": num_heads, "seq_len": seq_len, "batch": batch}
        if reason is not None:
            rows.append({**base, "status": "not run", "reason": reason})
            continue
        eff_dim = float(e)  # q isotropic: the b_k gradient noise is isotropic in e dimensions
        if path == "mha":
            mha64 = make_mha(e, num_heads, seed)
            mha = make_mha(e, num_heads, seed).to(device=device, dtype=tdt).train()
            eff_dim = query_effective_dim(mha64)
        for s in range(batches):
            bseed = seed + 1000 + s
            if path == "mha":
                x = torch.randn(batch, seq_len, e, generator=_gen(bseed), dtype=torch.float64).to(tdt)
                dout = (w_out + 0.5 * torch.randn(batch, seq_len, e, generator=_gen(bseed + 1),
                                                  dtype=torch.float64)).to(tdt)
                mha.zero_grad()
                (_mha_forward(mha, x.to(device)) * dout.to(device)).sum().backward()
                gb = mha.in_proj_bias.grad.double().cpu()
                g_bq, g_bk = gb[:e], gb[e:2 * e]
                proj = mha_projections(mha64, x.double())
                q64, v64 = proj["q"], proj["v"]
                # upstream of the attention core: dout through out_proj
                dy64 = _split_heads(dout.double() @ mha64.out_proj.weight.detach(), num_heads)
            else:
                q64, k64, v64 = random_qkv(batch, num_heads, seq_len, head_dim, bseed)
                dy64 = w + 0.5 * torch.randn(q64.shape, generator=_gen(bseed + 1), dtype=torch.float64)
                q_d, k_d, v_d, dy_d = (t.to(device=device, dtype=tdt) for t in (q64, k64, v64, dy64))
                q64, v64, dy64 = (t.double().cpu() for t in (q_d, v_d, dy_d))
                g_bq, g_bk = _core_grads(q_d, k_d, v_d, dy_d, path)
            tol = verdict.gradient_tolerance(
                dtype, head_dim=head_dim, n_queries=batch * seq_len, n_keys=seq_len,
                query_abs_max=float(q64.abs().max()), value_abs_max=float(v64.abs().max()),
                upstream_abs_max=float(dy64.abs().max()),
            )
            rows.append({
                **base, "status": "ok", "reason": "", "batch_index": s, "seed": bseed,
                "g_bq_norm": float(g_bq.norm()), "g_bk_norm": float(g_bk.norm()),
                "g_bk_max": float(g_bk.abs().max()), "g_bq_max": float(g_bq.abs().max()),
                "ratio": float(g_bk.norm() / g_bq.norm()),
                "tolerance": tol, "eff_dim": eff_dim,
                "verdict": verdict.classify(float(g_bk.abs().max()), tol,
                                            control_delta=float(g_bq.abs().max())),
                "finite": bool(torch.isfinite(g_bk).all() and torch.isfinite(g_bq).all()),
                "g_bq": g_bq.tolist(), "g_bk": g_bk.tolist(),
            })
    return pd.DataFrame(rows)


def query_effective_dim(mha: torch.nn.MultiheadAttention) -> float:
    """Effective dimension tr(C)^2 / tr(C^2) of the query covariance C = blockdiag_h(W_qh W_qh^T)
    for isotropic inputs: the b_k gradient noise sum_i q_i r_i lives in these directions."""
    e, h = mha.embed_dim, mha.num_heads
    w_q = mha.in_proj_weight.detach().double()[:e]
    blocks = [w_q[i * e // h:(i + 1) * e // h] for i in range(h)]
    covs = [blk @ blk.T for blk in blocks]
    tr = sum(float(torch.trace(c)) for c in covs)
    tr2 = sum(float((c * c).sum()) for c in covs)
    return tr * tr / tr2


def consistency(vectors: np.ndarray) -> dict[str, float]:
    """Direction statistics of S gradient vectors (rows): mean pairwise cosine, and
    R = |mean g| / mean |g| (1 for a fixed direction, ~1/sqrt(S) for independent noise)."""
    g = np.asarray(vectors, dtype=float)
    if g.ndim != 2 or g.shape[0] < 2:
        raise ValueError(f"need at least 2 vectors as rows, got shape {g.shape}")
    norms = np.linalg.norm(g, axis=1)
    keep = norms > 0
    g, norms = g[keep], norms[keep]
    s = g.shape[0]
    if s < 2:
        return {"mean_cos": math.nan, "consistency": math.nan, "vectors": s}
    unit = g / norms[:, None]
    gram = unit @ unit.T
    mean_cos = float((gram.sum() - s) / (s * (s - 1)))
    return {
        "mean_cos": mean_cos,
        "consistency": float(np.linalg.norm(g.mean(0)) / norms.mean()),
        "vectors": s,
    }


def noise_consistency_bound(dim: float, vectors: int, failure_probability: float = verdict.FAILURE_PROBABILITY) -> float:
    """Largest mean pairwise cosine that S independent isotropic directions in `dim`
    dimensions reach with probability 1 - p: |sum of S unit vectors|^2 ~ S chi2_dim / dim,
    so mean cos = (|sum|^2 - S) / (S (S - 1)) <= (chi2_{dim, 1-p} / dim - 1) / (S - 1)."""
    from scipy.stats import chi2

    if not dim >= 1:
        raise ValueError(f"dim must be >= 1, got {dim!r}")
    _check_size("vectors", vectors, 2)
    return float((chi2.ppf(1 - failure_probability, dim) / dim - 1) / (vectors - 1))


def gradient_summary(grads: pd.DataFrame) -> pd.DataFrame:
    """Per dtype and path: median |g_bk|/|g_bq|, that ratio over u, the largest b_k
    gradient entry over its rounding tolerance, and the direction statistics of b_k and
    b_q gradients across batches (with the isotropic-noise bound for the mean cosine)."""
    rows = []
    for (dtype, path), g in grads.groupby(["dtype", "path"], sort=False):
        rec = {"device": g["device"].iloc[0], "dtype": dtype, "path": path,
               "unit_roundoff": float(g["unit_roundoff"].iloc[0])}
        if not g["status"].eq("ok").all():
            rows.append({**rec, "status": "not run", "reason": g["reason"].iloc[0]})
            continue
        bk = np.array(g["g_bk"].tolist())
        bq = np.array(g["g_bq"].tolist())
        ck, cq = consistency(bk), consistency(bq)
        ratio = float(g["ratio"].median())
        rec.update(
            status="ok", reason="", batches=len(g), ratio_median=ratio,
            ratio_over_u=ratio / rec["unit_roundoff"],
            grad_over_tol_max=float((g["g_bk_max"] / g["tolerance"]).max()),
            control_over_tol_min=float((g["g_bq_max"] / g["tolerance"]).min()),
            verdict=(verdict.NOT_REDUNDANT if g["verdict"].eq(verdict.NOT_REDUNDANT).any()
                     else verdict.INVALID if g["verdict"].eq(verdict.INVALID).any() else verdict.REDUNDANT),
            bk_mean_cos=ck["mean_cos"], bk_consistency=ck["consistency"], bk_nonzero=ck["vectors"],
            bq_mean_cos=cq["mean_cos"], bq_consistency=cq["consistency"],
            eff_dim=float(g["eff_dim"].iloc[0]),
            cos_bound=noise_consistency_bound(float(g["eff_dim"].iloc[0]), max(ck["vectors"], 2)),
        )
        rows.append(rec)
    return pd.DataFrame(rows)


def other_devices(device: str, present: dict[str, bool] | None = None) -> pd.DataFrame:
    """Rows "not run" for the devices this run did not use, with the reason (never simulated)."""
    if present is None:
        from keybias.params import devices_present

        present = devices_present()
    rows = []
    for dev in DEVICES:
        if dev == device:
            continue
        reason = (f"{dev} not present on this machine" if not present.get(dev)
                  else f"{dev} present, but this run used DEVICE={device}")
        rows.append({"device": dev, "status": "not run", "reason": reason})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- claims, tables
def normal_quantile(failure_probability: float = verdict.FAILURE_PROBABILITY) -> float:
    """z with P(|N(0, 1)| > z) = p: the number of standard errors a fit may miss by chance."""
    from scipy.stats import norm

    return float(norm.isf(failure_probability / 2))


def crossing_check(crossing: pd.DataFrame, law: pd.DataFrame, grid_step_log10: float) -> pd.DataFrame:
    """Compare measured and predicted accuracy crossings (float64 is the reference and has
    none). The allowance is half a grid step (the measured crossing is interpolated on the
    grid) plus z times the scatter of the model constant in that fit (z = `normal_quantile`).
    A row where only one of the two crosses within the grid gets deviation inf."""
    z = normal_quantile()
    m = crossing.merge(law[["dtype", "path", "model_scatter_log10"]], on=["dtype", "path"], how="left")
    measured, predicted = np.isfinite(m["crossing"]), np.isfinite(m["crossing_pred"])
    # neither crosses (no error to double): nothing to compare; only one crosses: a miss (inf)
    m = m[measured | predicted].copy()
    both = np.isfinite(m["crossing"]) & np.isfinite(m["crossing_pred"])
    m["deviation_log10"] = np.where(both, np.abs(np.log10(m["crossing"] / m["crossing_pred"])), np.inf)
    m["allowance_log10"] = grid_step_log10 / 2 + z * m["model_scatter_log10"].fillna(0.0)
    return m


def failure_probability_tex(p: float = verdict.FAILURE_PROBABILITY) -> str:
    """p as LaTeX math: `10^{-6}` for a power of ten, else a x 10^{b}."""
    from keybias.export import format_number

    e = math.log10(p)
    return f"10^{{{round(e)}}}" if abs(e - round(e)) < 1e-12 else format_number(p)


def unit_roundoff_span_log2(dtypes) -> float:
    """log2(max u / min u) over the given dtypes (u from keybias.verdict.UNIT_ROUNDOFF)."""
    us = [verdict.unit_roundoff(d) for d in dtypes]
    if not us:
        return math.nan
    return math.log2(max(us) / min(us))


def _span_tex(dtypes) -> str:
    span = unit_roundoff_span_log2(dtypes)
    return f"2^{round(span)}" if math.isfinite(span) else "an undefined range"


def _ratio_max(num, den, what: str) -> float:
    """max(num / den) over the selection; NaN if empty or not finite (the claim then fails)."""
    return finite_max(np.asarray(num, dtype=float) / np.asarray(den, dtype=float), what)


def powered_outputs(errors: pd.DataFrame) -> pd.DataFrame:
    """The measured rows (dtype, path, magnitude) whose rounding tolerance is below the RMS
    output: there a break that moves the output by its own size would exceed the tolerance.
    At large |b_k| in half precision the worst-case tolerance exceeds the output itself, and
    "within tolerance" says nothing; those magnitudes are judged by the rounding-model claim."""
    ok = errors[errors["status"].eq("ok")]
    return ok[ok["tolerance"] < ok["ref_rms"]]


def powered_gradients(gsum: pd.DataFrame) -> pd.DataFrame:
    """The (dtype, path) rows where the b_q gradient, the positive control, exceeds the
    rounding tolerance in every batch: only there could the tolerance see a gradient of the
    size a real bias has, so only there does "within tolerance" say anything."""
    ok = gsum[gsum["status"].eq("ok")] if "status" in gsum else gsum.iloc[0:0]
    return ok[ok["control_over_tol_min"] > 1]


def precision_claims(law, pooled, errors, checks, gsum, grads, seq_len) -> list[dict]:
    """The findings of notebook 03 as claims (keyword dicts for `Recorder.claim`), each with
    its kind, the origin of its bound and, for "no effect" claims, the smallest effect it
    would have seen. Pure: tests hand it doctored data or a mutated model's measurements.
    Every reduction is over an explicit selection; an empty one gives NaN, which fails.

    law, pooled: `fit_law` / `pooled_slope` of the main run; checks: `crossing_check` of the
    main run's crossings against the model calibrated on the held-out seed; gsum, grads:
    `gradient_summary` and the per-batch rows of `gradient_sweep`.
    """
    ok_err = errors[errors["status"].eq("ok")]
    judged = powered_outputs(errors)
    ok_g = gsum[gsum["status"].eq("ok")] if "status" in gsum else gsum.iloc[0:0]
    ok_b = grads[grads["status"].eq("ok")] if "status" in grads else grads.iloc[0:0]
    powered = powered_gradients(gsum)
    p_tex = f"{verdict.FAILURE_PROBABILITY:g}"
    run_dtypes = list(dict.fromkeys(ok_err["dtype"]))
    # every dtype that ran must have a pooled slope: a dtype without a fit fails the claim
    slope_dev = pd.Series({d: math.nan for d in run_dtypes}, dtype=float)
    detectable = slope_dev.copy()
    for _, row in pooled.iterrows():
        slope_dev[row["dtype"]] = row["slope_dev"]
        detectable[row["dtype"]] = row["detectable_dev"]
    # every (dtype, path) that ran must have a model constant
    ran = ok_err[["dtype", "path"]].drop_duplicates()
    covered = ran.merge(law[["dtype", "path", "model_constant"]], on=["dtype", "path"], how="left") if len(law) else ran.assign(model_constant=math.nan)
    lam_sqrt_n = verdict.LAMBDA * math.sqrt(seq_len)
    claims = [
        dict(claim_id="precision-output-change-within-tolerance", kind="test",
             bound_origin="verdict rule's rounding bound for each magnitude's own scores and values (theory)",
             min_detectable=_ratio_max(judged["tolerance"], judged["ref_rms"], "tolerance over output RMS"),
             statement="For every dtype, code path and key-bias magnitude whose rounding tolerance lies below the RMS output, the largest output change that b_k causes stays within the tolerance for that magnitude; the smallest detectable change, relative to the RMS output, is given for the worst judged magnitude.",
             value=_ratio_max(judged["delta_max"], judged["tolerance"], "output change over tolerance"),
             bound=1.0, comparison="<="),
        dict(claim_id="precision-law-slope-one", kind="test",
             bound_origin="fixed margin: the first-order model's validity limit VALIDITY, set before the run",
             min_detectable=finite_max(detectable, "detectable slope deviation per dtype"),
             statement=f"For every dtype, the pooled log-log slope of the b_k-induced output change against |b_k|/|k| is within the fixed margin of 1 that the first-order model allows; a true slope farther from 1 than the margin plus z standard errors (z for p = {p_tex}), the smallest detectable deviation, would have failed it.",
             value=finite_max(slope_dev, "slope deviation per dtype") / SLOPE_MARGIN, bound=1.0, comparison="<="),
        dict(claim_id="precision-rounding-model-constant", kind="test",
             bound_origin="probabilistic rounding constant lambda of Higham and Mary (theory)",
             statement="Across dtypes and code paths, the first-order rounding model predicts the measured change within a factor lambda (the probabilistic rounding constant of Higham & Mary).",
             value=finite_max(np.abs(np.log10(covered["model_constant"].to_numpy(dtype=float))), "model constants (log10)"),
             bound=math.log10(verdict.LAMBDA), comparison="<="),
        dict(claim_id="precision-accuracy-crossing-law", kind="test",
             bound_origin="half a grid step plus z times the scatter of the model constant calibrated on a held-out seed",
             statement="The magnitude |b_k|/|k| at which the error against float64 doubles agrees with the prediction of the rounding model calibrated on a held-out seed, within half a grid step plus z times the scatter of that calibration.",
             value=_ratio_max(checks["deviation_log10"], checks["allowance_log10"], "crossing deviation over allowance")
             if len(checks) else math.nan,
             bound=1.0, comparison="<="),
        dict(claim_id="precision-bk-gradient-within-tolerance", kind="test",
             bound_origin="verdict rule's rounding bound from the measured query, value and upstream-gradient magnitudes (theory)",
             min_detectable=_ratio_max(1.0 / powered["control_over_tol_min"].to_numpy(dtype=float),
                                       np.ones(len(powered)), "tolerance over control"),
             statement="In every dtype and code path where the b_q gradient (positive control) exceeds the rounding tolerance, every entry of the b_k gradient stays within it; the smallest b_k gradient it would have seen, as a fraction of the b_q gradient, is given for the worst case.",
             value=finite_max(powered["grad_over_tol_max"], "b_k gradient over tolerance (powered rows)"),
             bound=1.0, comparison="<="),
        dict(claim_id="precision-bk-gradient-noise-scale", kind="test",
             bound_origin="rounding of n-term row sums: lambda sqrt(n) u times the measured b_q gradient (theory)",
             min_detectable=finite_max(lam_sqrt_n * ok_b["unit_roundoff"], "largest noise bound"),
             statement="In every dtype, code path and batch, |grad b_k| / |grad b_q| stays below lambda sqrt(n) u, the size of rounding noise in row sums of n terms: the b_k gradient is no larger than rounding noise at the scale of the measured gradients.",
             value=_ratio_max(ok_b["ratio"], lam_sqrt_n * ok_b["unit_roundoff"], "gradient ratio over noise bound"),
             bound=1.0, comparison="<="),
    ]
    g_dtypes = list(dict.fromkeys(ok_g["dtype"])) if len(ok_g) else []
    if len(g_dtypes) >= 2:
        claims.append(dict(
            claim_id="precision-bk-gradient-scales-with-u", kind="test",
            bound_origin="lambda sqrt(n), the spread rounding noise allows (theory)",
            statement=f"The ratio |grad b_k| / |grad b_q| divided by the unit roundoff varies across dtypes and paths by less than lambda sqrt(n), while u itself spans {_span_tex(g_dtypes)}.",
            value=finite_max(ok_g["ratio_over_u"], "ratio over u") / finite_min(ok_g["ratio_over_u"], "ratio over u"),
            bound=lam_sqrt_n, comparison="<="))
    # a consistent component of relative size a (to the noise) gives mean cosine a^2 / (1 + a^2)
    cos_bound = ok_g["cos_bound"].to_numpy(dtype=float) if len(ok_g) else np.array([])
    claims += [
        dict(claim_id="precision-bk-gradient-no-direction", kind="test",
             bound_origin=f"isotropic-noise bound on the mean pairwise cosine at p = {p_tex} (theory)",
             min_detectable=finite_max(np.sqrt(cos_bound / np.clip(1 - cos_bound, 1e-12, None)), "detectable consistent component"),
             statement=f"The b_k gradients of independent batches point in unrelated directions: their mean pairwise cosine stays within what isotropic noise reaches (p = {p_tex}); a consistent component of the size given, relative to the noise, would have exceeded it.",
             value=finite_max(ok_g["bk_mean_cos"].abs().to_numpy(dtype=float) / cos_bound, "b_k cosine over bound"),
             bound=1.0, comparison="<="),
        dict(claim_id="precision-bq-gradient-consistent", kind="test",
             bound_origin=f"isotropic-noise bound on the mean pairwise cosine at p = {p_tex} (theory)",
             statement=f"Positive control: the b_q gradients of the same batches share a direction, their mean pairwise cosine exceeding what isotropic noise reaches (p = {p_tex}).",
             value=finite_min(ok_g["bq_mean_cos"].to_numpy(dtype=float) / cos_bound, "b_q cosine over bound"),
             bound=1.0, comparison=">"),
    ]
    return claims


# ----------------------------------------------------------------------------- macros
def run_macros(*, head_dim, num_heads, seq_len, batch, grad_batches, ratio_points,
               ratio_log10_min, ratio_log10_max) -> dict[str, tuple]:
    """Macros for the parameters and method constants of the run: name -> (value, digits)."""
    return {
        "PrecHeadDim": (int(head_dim), 3), "PrecNumHeads": (int(num_heads), 3),
        "PrecSeqLen": (int(seq_len), 3), "PrecBatch": (int(batch), 3),
        "PrecGradBatches": (int(grad_batches), 3), "PrecRatioPoints": (int(ratio_points), 3),
        "PrecRatioMin": (10.0**ratio_log10_min, 3), "PrecRatioMax": (10.0**ratio_log10_max, 3),
        "PrecLambda": (verdict.LAMBDA, 2), "PrecZ": (normal_quantile(), 2), "PrecRho": (RHO, 2),
        "PrecDominance": (int(DOMINANCE) if float(DOMINANCE).is_integer() else DOMINANCE, 2),
        "PrecValidity": (VALIDITY, 2),
        "PrecFailureProbability": (failure_probability_tex(), 3),
        "PrecInvSqrtTwo": (1 / math.sqrt(2), 2),
        "PrecSqrtBatchesInv": (1 / math.sqrt(grad_batches), 2),
    }


def law_macros(errors: pd.DataFrame, law: pd.DataFrame, pooled: pd.DataFrame) -> dict[str, tuple]:
    """Macros of the law fit: pooled slope per dtype (with SE, detectable deviation, fit points and the
    second-order size), model constants by kernel family (wide dtypes; SDPA in half
    precision; other paths in half precision), extremes. name -> (value, digits)."""
    out: dict[str, tuple] = {}
    for _, p in pooled.iterrows():
        if p["dtype"] not in DTYPE_MACRO or not np.isfinite(p["slope"]):
            continue
        name = DTYPE_MACRO[p["dtype"]]
        out["PrecSlope" + name] = (float(p["slope"]), 4)
        out["PrecFitPoints" + name] = (int(p["points"]), 3)
        out["PrecSlopeSe" + name] = (float(p["slope_se"]), 2)
        out["PrecSlopeDetectable" + name] = (float(p["detectable_dev"]), 2)
        out["PrecSecondOrder" + name] = (float(p["second_order"]), 2)
    if len(law):
        half = law["dtype"].isin(["bfloat16", "float16"])
        sdpa = law["path"].str.startswith("sdpa")
        for name, sel in [("Wide", ~half), ("SdpaHalf", half & sdpa), ("OtherHalf", half & ~sdpa)]:
            if sel.any():
                out["PrecModelConst" + name] = (float(law.loc[sel, "model_constant"].mean()), 2)
        out["PrecModelConstMin"] = (float(law["model_constant"].min()), 2)
        out["PrecModelConstMax"] = (float(law["model_constant"].max()), 2)
        out["PrecLawResidMax"] = (float(law["resid_log10"].max()), 2)
    ok = errors[errors["status"].eq("ok")]
    out["PrecOutputTolMax"] = (_ratio_max(ok["delta_max"], ok["tolerance"], "output change over tolerance"), 2)
    judged = powered_outputs(errors)
    out["PrecOutputMinDetectable"] = (_ratio_max(judged["tolerance"], judged["ref_rms"], "tolerance over output RMS"), 2)
    out["PrecOutputJudgedCount"] = (len(judged), 3)
    out["PrecOutputRowCount"] = (len(ok), 3)
    out["PrecOutputJudgedRatioMaxHalf"] = (finite_max(judged.loc[judged["dtype"].isin(["bfloat16", "float16"]), "ratio"],
                                                      "largest judged magnitude in half precision"), 2)
    out["PrecSlopeMargin"] = (SLOPE_MARGIN, 2)
    return out


def crossing_macros(errors: pd.DataFrame, crossing: pd.DataFrame, checks: pd.DataFrame) -> dict[str, tuple]:
    """Macros of the accuracy crossing: range per dtype and overall, the largest deviation
    from the prediction, the largest relative error per half dtype. name -> (value, digits)."""
    out: dict[str, tuple] = {}
    for dtype, c in crossing.groupby("dtype", sort=False):
        c = c["crossing"].dropna()
        if len(c) and dtype in DTYPE_MACRO:
            out["PrecCrossMin" + DTYPE_MACRO[dtype]] = (float(c.min()), 2)
            out["PrecCrossMax" + DTYPE_MACRO[dtype]] = (float(c.max()), 2)
    ok = errors[errors["status"].eq("ok")]
    for dtype in ("bfloat16", "float16"):
        e = ok[ok["dtype"] == dtype]
        if len(e):
            out["PrecErrMax" + DTYPE_MACRO[dtype]] = (float(e["err_rms"].max()), 2)
    fin = crossing["crossing"].dropna() if len(crossing) else pd.Series(dtype=float)
    out["PrecCrossMin"] = (finite_min(fin, "crossings"), 2)
    out["PrecCrossMax"] = (finite_max(fin, "crossings"), 2)
    out["PrecCrossDevMax"] = (finite_max(checks["deviation_log10"], "crossing deviations"), 2)
    return out


def gradient_macros(gsum: pd.DataFrame, grads: pd.DataFrame, seq_len: int) -> dict[str, tuple]:
    """Macros of the gradient summary (ok rows only), including log2 of the span of u over
    the dtypes whose gradients were measured, the powered cases of the tolerance claim and
    what the gradient claims could have detected. name -> (value, digits)."""
    okg = gsum[gsum["status"].eq("ok")]
    okb = grads[grads["status"].eq("ok")]
    span = unit_roundoff_span_log2(list(dict.fromkeys(okg["dtype"])))
    powered = powered_gradients(gsum)
    lam_sqrt_n = verdict.LAMBDA * math.sqrt(seq_len)
    cos_bound = okg["cos_bound"].to_numpy(dtype=float)
    return {
        "PrecGradPoweredCount": (len(powered), 3),
        "PrecGradPoweredDtypes": (", ".join(dict.fromkeys(powered["dtype"])) or "none", 3),
        "PrecGradMinDetectable": (finite_max(1.0 / powered["control_over_tol_min"].to_numpy(dtype=float),
                                             "tolerance over control"), 2),
        "PrecGradNoiseBoundFactor": (lam_sqrt_n, 2),
        "PrecGradNoiseScaleMax": (_ratio_max(okb["ratio"], lam_sqrt_n * okb["unit_roundoff"], "ratio over bound"), 2),
        "PrecBkCosMinDetectable": (finite_max(np.sqrt(cos_bound / np.clip(1 - cos_bound, 1e-12, None)),
                                              "detectable consistent component"), 2),
        "PrecUnitRoundoffSpanLog": (int(round(span)) if math.isfinite(span) else span, 3),
        "PrecRatioOverUMin": (finite_min(okg["ratio_over_u"], "gradient summary"), 2),
        "PrecRatioOverUMax": (finite_max(okg["ratio_over_u"], "gradient summary"), 2),
        "PrecBkCosMax": (finite_max(okg["bk_mean_cos"].abs(), "gradient summary"), 2),
        "PrecBqCosMin": (finite_min(okg["bq_mean_cos"], "gradient summary"), 2),
        "PrecCosBoundMin": (finite_min(okg["cos_bound"], "gradient summary"), 2),
        "PrecBkConsistencyMax": (finite_max(okg["bk_consistency"], "gradient summary"), 2),
        "PrecBqConsistencyMin": (finite_min(okg["bq_consistency"], "gradient summary"), 2),
        "PrecGradTolMax": (finite_max(okg["grad_over_tol_max"], "gradient summary"), 2),
        "PrecGradRedundantCount": (int(okg["verdict"].eq(verdict.REDUNDANT).sum()), 3),
        "PrecGradInvalidCount": (int(okg["verdict"].eq(verdict.INVALID).sum()), 3),
        "PrecGradCaseCount": (len(okg), 3),
    }


# ----------------------------------------------------------------------------- figures
def _path_colors() -> dict[str, str]:
    """One Okabe-Ito colour per code path, the same in every panel and figure."""
    from keybias.style import OKABE_ITO

    return {path: OKABE_ITO[i] for i, path in enumerate(PATHS)}


def plot_error_vs_bias(errors: pd.DataFrame, law: pd.DataFrame, dtypes):
    """One panel per dtype: RMS change y(b_k) - y(0) per path (markers), the fitted law over
    its fitted range (dashed), the rounding model (thin black) and each path's verdict
    tolerance for the largest entry at each magnitude (dotted). Returns the figure, made at
    the paper's full width with the keybias style (call `keybias.style.apply()` first)."""
    import matplotlib.pyplot as plt

    from keybias import style

    colors = _path_colors()
    ok = errors[errors["status"].eq("ok")]
    rows = math.ceil(len(dtypes) / 2)
    fig, axes = plt.subplots(rows, 2, figsize=(style.FULL_WIDTH, 2.3 * rows), sharex=True, squeeze=False)
    for ax, dtype in zip(axes.flat, dtypes, strict=False):
        model_drawn = set()
        for path, g in ok[ok["dtype"].eq(dtype)].groupby("path", sort=False):
            color = colors[path]
            ax.loglog(g["ratio"], g["delta_rms"], "o", ms=3, color=color, label=path)
            ax.loglog(g["ratio"], g["tolerance"], ":", color=color, lw=0.8)
            f = law[(law["dtype"] == dtype) & (law["path"] == path)] if len(law) else law
            if len(f) and np.isfinite(f["slope"].iloc[0]):
                r = np.geomspace(f["ratio_min"].iloc[0], f["ratio_max"].iloc[0], 20)
                ax.loglog(r, f["const"].iloc[0] * r ** f["slope"].iloc[0], "--", color=color, lw=1)
            family = "mha" if path == "mha" else "core"  # the model differs only between these
            if family not in model_drawn:
                model_drawn.add(family)
                ax.loglog(g["ratio"], g["pred_rms"], "-", color=style.OKABE_ITO[7], lw=0.6)
        ax.set_title(dtype)
        ax.set_ylabel("RMS output change")
    for ax in axes.flat[len(dtypes):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel(r"$\|b_k\| / \|k\|$")
    handles = [plt.Line2D([], [], color=colors[p], marker="o", ls="", ms=3, label=p)
               for p in PATHS if p in set(ok["path"])]
    handles += [plt.Line2D([], [], color="0", ls="--", lw=1, label="fitted law"),
                plt.Line2D([], [], color=style.OKABE_ITO[7], lw=0.6, label="rounding model"),
                plt.Line2D([], [], color="0", ls=":", lw=0.8, label="tolerance")]
    fig.tight_layout()
    style.legend_outside(fig, handles=handles, ncol=4)
    return fig


def plot_accuracy(errors: pd.DataFrame, crossing: pd.DataFrame, dtypes, factor: float = CROSSING_FACTOR):
    """One panel per dtype below float64: error against float64 with b_k over the error
    without it, per path, at each magnitude, with the level `factor` (dashed) and the
    measured crossings (dotted). Returns the figure (None if only float64 ran)."""
    import matplotlib.pyplot as plt

    from keybias import style

    colors = _path_colors()
    ok = errors[errors["status"].eq("ok")]
    low = [d for d in dtypes if d != "float64"]
    if not low:
        return None
    fig, axes = plt.subplots(1, len(low), figsize=(style.FULL_WIDTH, 2.4), sharey=True, squeeze=False)
    for ax, dtype in zip(axes[0], low, strict=True):
        for path, g in ok[ok["dtype"].eq(dtype)].groupby("path", sort=False):
            ax.loglog(g["ratio"], g["err_rms"] / g["err0_rms"], "o-", ms=2.5, lw=0.8, color=colors[path], label=path)
            c = crossing[(crossing["dtype"] == dtype) & (crossing["path"] == path)]["crossing"]
            if len(c) and np.isfinite(c.iloc[0]):
                ax.axvline(c.iloc[0], color=colors[path], lw=0.6, ls=":")
        ax.axhline(factor, color="0", lw=0.8, ls="--")
        ax.set_title(dtype)
        ax.set_xlabel(r"$\|b_k\| / \|k\|$")
    axes[0][0].set_ylabel("error with $b_k$ / without")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.tight_layout()
    style.legend_outside(fig, handles=handles, labels=labels, ncol=len(labels))
    return fig


def plot_gradient(gsum: pd.DataFrame):
    """Left: |g_bk|/|g_bq| against u per path, with the line u. Right: mean pairwise cosine
    across batches of the b_k and b_q gradients with the isotropic-noise bound. Returns the
    figure."""
    import matplotlib.pyplot as plt

    from keybias import style

    colors = _path_colors()
    okg = gsum[gsum["status"].eq("ok")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(style.FULL_WIDTH, 3.0), width_ratios=(1, 1.6))
    for path, g in okg.groupby("path", sort=False):
        ax1.loglog(g["unit_roundoff"], g["ratio_median"], "o", ms=3.5, color=colors[path], label=path)
    u = np.array(sorted(okg["unit_roundoff"].unique()))
    ax1.loglog(u, u, "--", color="0", lw=0.8, label="$u$")
    ax1.set_xlabel("unit roundoff $u$")
    ax1.set_ylabel(r"$\|g_{b_k}\| / \|g_{b_q}\|$")
    labels = [f"{d} {p}" for d, p in zip(okg["dtype"], okg["path"], strict=True)]
    x = np.arange(len(okg))
    ax2.bar(x - 0.2, okg["bk_mean_cos"], 0.4, color=style.OKABE_ITO[3], label="$b_k$ cosine")
    ax2.bar(x + 0.2, okg["bq_mean_cos"], 0.4, color=style.OKABE_ITO[5], label="$b_q$ cosine")
    ax2.plot(x, okg["cos_bound"], "_", color="0", ms=8, label="noise bound")
    ax2.plot(x, -okg["cos_bound"], "_", color="0", ms=8)
    ax2.set_xticks(x, labels, rotation=90)
    ax2.set_ylabel("mean pairwise cosine")
    h1, l1 = ax1.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    fig.tight_layout()
    style.legend_outside(fig, handles=h1 + h2, labels=l1 + l2, ncol=5)
    return fig


def gradient_table_with_devices(gsum: pd.DataFrame, absent: pd.DataFrame) -> str:
    """`gradient_table` of the measured rows plus one not-run row per absent device."""
    return gradient_table(pd.concat([gsum, absent.assign(dtype="all", path="all")], ignore_index=True))


def law_table(law: pd.DataFrame) -> str:
    """The fitted law per dtype and path as a LaTeX tabular body (booktabs)."""
    frame = pd.DataFrame({
        "dtype": law["dtype"], "path": law["path"].str.replace("_", r"\_"), "points": law["points"],
        "slope": [f"${s:.3f} \\pm {e:.3f}$" for s, e in zip(law["slope"], law["slope_se"], strict=True)],
        "$A/u$": [f"{c:.3g}" for c in law["const_over_u"]],
        "$C$ (model)": [f"{c:.2f}" for c in law["model_constant"]],
        "resid. (dex)": [f"{r:.3f}" for r in law["resid_log10"]],
    })
    return frame.to_latex(index=False, escape=False)


def gradient_table(gsum: pd.DataFrame) -> str:
    """Gradient summary per dtype and path as a LaTeX tabular body; not-run rows keep their
    reason."""
    rows = []
    for _, r in gsum.iterrows():
        base = {"device": r["device"], "dtype": r["dtype"], "path": str(r["path"]).replace("_", r"\_")}
        if r["status"] != "ok":
            reason = str(r["reason"]).replace("_", r"\_").replace("%", r"\%")
            rows.append({**base, "ratio": "not run", "cos_k": "", "cos_q": "", "bound": reason[:48]})
            continue
        rows.append({**base, "ratio": f"{r['ratio_over_u']:.3f}", "cos_k": f"{r['bk_mean_cos']:+.3f}",
                     "cos_q": f"{r['bq_mean_cos']:.3f}", "bound": f"{r['cos_bound']:.3f}"})
    frame = pd.DataFrame(rows).rename(columns={
        "ratio": r"$\|g_{b_k}\|/(u\|g_{b_q}\|)$", "cos_k": r"$\cos b_k$", "cos_q": r"$\cos b_q$",
        "bound": "noise bound / reason"})
    return frame.to_latex(index=False, escape=False)
