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
slope 1 in log-log, with a constant C that `keybias.studies.precision.judge.fit_law` measures per dtype and path.

This module measures (it returns DataFrames); `keybias.studies.precision.judge` fits the law and turns
the measurements into claims and macros, and `keybias.studies.precision.show` draws the figures and
tables of notebook 03.

Gradient. In exact arithmetic dL/db_k = sum_i q_i (sum_j ds_ij) / sqrt(d) = 0 because each
row of the softmax Jacobian sums to zero; in floating point the row sums are rounding errors,
so the gradient is noise of size ~u (see keybias.verdict for the bound).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import torch
from scipy.stats import chi2
from tqdm import tqdm

from keybias import verdict
from keybias.studies.config import StudyConfig
from keybias.studies.fixtures import reference as R
from keybias.studies.params import DTYPES, Param, ParameterError, devices_present

# Code paths: the attention product written out, F.scaled_dot_product_attention with each
# backend that runs on CPU, and nn.MultiheadAttention (b_k enters through the in-projection).
PATHS = ("explicit", "sdpa_math", "sdpa_flash", "sdpa_efficient", "mha")
DEVICES = ("cpu", "cuda", "mps")
TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}
# Std of round-to-nearest error in units of u|x| for a log-uniform mantissa.
RHO = math.sqrt(1.0 / (8.0 * math.log(2.0)))

PARAMETERS: dict[str, Param] = {
    "dtypes": Param(str, many=True, choices=DTYPES, help="working precisions"),
    "paths": Param(str, many=True, choices=PATHS, help="attention code paths"),
    "head_dim": Param(int, minimum=2, maximum=512, help="d, dimension per head"),
    "num_heads": Param(int, positive=True, maximum=16, help="query heads"),
    "seq_len": Param(int, minimum=2, maximum=1024, help="n, keys (= queries) per sequence"),
    "batch": Param(int, positive=True, maximum=256, help="sequences per measurement"),
    "ratio_log10_min": Param(float, minimum=-8, maximum=4, help="smallest log10 |b_k|/|k|"),
    "ratio_log10_max": Param(float, minimum=-8, maximum=4, help="largest log10 |b_k|/|k|"),
    "ratio_points": Param(int, minimum=3, maximum=200, help="magnitudes on the log grid"),
    "grad_batches": Param(int, minimum=3, maximum=512, help="independent batches for gradients"),
    "seed": Param(int, minimum=0, help="seed of the weights and inputs"),
    "calibration_seed": Param(int, minimum=0, help="seed of the held-out run that calibrates the crossing prediction"),
}


@dataclasses.dataclass(frozen=True)
class PrecisionConfig(StudyConfig):
    """Every setting of notebook 03, validated once against `PARAMETERS`; defaults = the smoke profile."""

    PARAMETERS = PARAMETERS
    STUDY = "03_precision"

    dtypes: tuple[str, ...] = ("float64", "float32", "bfloat16", "float16")
    paths: tuple[str, ...] = ("explicit", "sdpa_math", "mha")
    head_dim: int = 32
    num_heads: int = 1
    seq_len: int = 32
    batch: int = 4
    ratio_log10_min: float = -1.5
    ratio_log10_max: float = 3.0
    ratio_points: int = 10
    grad_batches: int = 8
    seed: int = 0
    calibration_seed: int = 1

    def check(self) -> None:
        if self.ratio_log10_min >= self.ratio_log10_max:
            raise ParameterError(f"{self.STUDY}: ratio_log10_min ({self.ratio_log10_min}) must be < "
                                 f"ratio_log10_max ({self.ratio_log10_max})")
        if self.calibration_seed == self.seed:
            raise ParameterError(f"{self.STUDY}: calibration_seed must differ from seed ({self.seed}): the "
                                 "crossing prediction is calibrated on held-out data")

    @property
    def ratios(self) -> np.ndarray:
        """The log grid of |b_k| / |k| that both error sweeps use."""
        return bias_ratios(self.ratio_log10_min, self.ratio_log10_max, self.ratio_points)

    @property
    def grid_step_log10(self) -> float:
        """The spacing of that grid in log10 (half of it is the crossing claim's interpolation allowance)."""
        return (self.ratio_log10_max - self.ratio_log10_min) / (self.ratio_points - 1)

    @property
    def sizes(self) -> dict:
        """The attention sizes every sweep of this config shares."""
        return dict(head_dim=self.head_dim, num_heads=self.num_heads, seq_len=self.seq_len, batch=self.batch)


def run_error_sweep(cfg: PrecisionConfig, device: str, seed: int, progress: bool = False) -> pd.DataFrame:
    """`error_sweep` over the config's dtypes, paths and magnitudes with `seed` (cfg.seed for the main
    run, cfg.calibration_seed for the held-out calibration)."""
    return error_sweep(list(cfg.dtypes), list(cfg.paths), **cfg.sizes, ratios=cfg.ratios, seed=seed,
                       device=device, progress=progress)


def run_gradient_sweep(cfg: PrecisionConfig, device: str, progress: bool = False) -> pd.DataFrame:
    """`gradient_sweep` over the config's dtypes and paths, cfg.grad_batches batches, seed cfg.seed."""
    return gradient_sweep(list(cfg.dtypes), list(cfg.paths), **cfg.sizes, batches=cfg.grad_batches,
                          seed=cfg.seed, device=device, progress=progress)


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
    if path not in ("explicit", *R.SDPA_BACKENDS):
        raise ValueError(f"path {path!r} is not an attention-core path; allowed: {list(R.SDPA_BACKENDS) + ['explicit']}")
    return R.core(q, k, v, path=path)


def make_mha(embed_dim: int, num_heads: int, seed: int) -> torch.nn.MultiheadAttention:
    """A float64 nn.MultiheadAttention with PyTorch's default init (biases zero), fixed seed."""
    torch.manual_seed(seed)
    mha = torch.nn.MultiheadAttention(embed_dim, num_heads, batch_first=True, dtype=torch.float64)
    return mha.eval()


def mha_projections(mha: torch.nn.MultiheadAttention, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """q, k, v per head (batch, heads, n, d) of self-attention on x, in float64 with b_k = 0."""
    params = R.mha_params(mha, torch.float64)
    params["b_k"] = torch.zeros_like(params["b_k"])
    q, k, v = R.project(x.double(), x.double(), params, num_heads=mha.num_heads)
    return {"q": q, "k": k, "v": v}


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
    if path not in R.SDPA_BACKENDS:
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
                dy64 = R.split_heads(dout.double() @ mha64.out_proj.weight.detach(), num_heads)
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
        present = devices_present()
    rows = []
    for dev in DEVICES:
        if dev == device:
            continue
        reason = (f"{dev} not present on this machine" if not present.get(dev)
                  else f"{dev} present, but this run used DEVICE={device}")
        rows.append({"device": dev, "status": "not run", "reason": reason})
    return pd.DataFrame(rows)
