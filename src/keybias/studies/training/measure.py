"""Training dynamics of the key bias: a tiny vision transformer on scikit-learn's digits.

The model is a small ViT built from `nn.TransformerEncoderLayer` (whose attention is
`nn.MultiheadAttention`). Each attention layer's packed bias `in_proj_bias = [b_q; b_k; b_v]`
is split into three tensors (`split_in_proj_bias`), so the key bias can either be a trained
parameter (kept) or a zero buffer that no optimizer ever sees (removed). Everything else,
the seed, the initial weights, the data order, is shared between a kept and a removed run.

Why b_k should not matter (see notebook 01): the scores of one query are
q . (k_j + b_k) = q . k_j + q . b_k, the same shift for every key j, and softmax is invariant
to a constant shift. The gradient of b_k is therefore zero in exact arithmetic; in floating
point it is rounding noise (bounded by `keybias.verdict.gradient_tolerance`). SGD moves b_k
by lr times that noise (tiny); Adam divides it by its own running RMS and moves b_k by about
lr per step in a random direction, unless eps is larger than the noise.

Everything runs on CPU; the model never leaves training mode (dropout is 0, so training
and evaluation mode are the same function, and staying in training mode keeps PyTorch's
separate inference fast path, a different kernel, out of the comparison).

The model, data and optimizers are in `keybias.studies.training.model`, the drift predictions
in `keybias.studies.training.drift`. This module measures (returns DataFrames); the claims,
macros and tables are in
`keybias.studies.training.judge`, the figures in `keybias.studies.training.show`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from contextlib import contextmanager, nullcontext

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from keybias import verdict
from keybias.core.reduce import finite_max, finite_median, require_finite
from keybias.studies.config import StudyConfig
from keybias.studies.fixtures import reference as R
from keybias.studies.params import Param, ParameterError, check_choice, check_positive_int
from keybias.studies.training.drift import predicted_adam_drift, random_walk_drift, sgd_random_walk
from keybias.studies.training.model import (
    DEFAULT_EPS,
    OPTIMIZER_LABELS,
    OPTIMIZERS,
    PATCH_SIZES,
    TRAIN_DTYPES,
    attention_modules,
    batch_order,
    build_model,
    check_model_config,
    check_train_config,
    load_digits_split,
    make_optimizer,
    optimizer_lr,
)

PARAMETERS: dict[str, Param] = {
    "seeds": Param(int, many=True, minimum=0, help="seeds of the kept-vs-removed pairs (init and data order)"),
    "bias_seeds": Param(int, many=True, minimum=0, help="seeds of each bias-study setting"),
    "steps": Param(int, positive=True, help="optimizer steps per run"),
    "batch_size": Param(int, positive=True, help="minibatch size"),
    "eval_every": Param(int, positive=True, help="steps between test-accuracy evaluations"),
    "embed_dim": Param(int, positive=True, help="transformer width"),
    "num_heads": Param(int, positive=True, help="attention heads"),
    "num_layers": Param(int, positive=True, help="encoder layers"),
    "patch": Param(int, choices=PATCH_SIZES, help="patch side in pixels (8x8 images)"),
    "pair_optimizers": Param(
        str, many=True, choices=OPTIMIZERS, help="optimizers for the kept-vs-removed comparison"
    ),
    "optimizers": Param(str, many=True, choices=OPTIMIZERS, help="optimizers for the bias study"),
    "adam_eps": Param(float, many=True, positive=True, help="eps values for Adam in the bias study"),
    "dtypes": Param(str, many=True, choices=TRAIN_DTYPES, help="float32 or bfloat16 autocast"),
    "lr_sgd": Param(float, positive=True, help="learning rate of SGD and SGD + momentum"),
    "lr_adam": Param(float, positive=True, help="learning rate of Adam and AdamW"),
    "momentum": Param(float, minimum=0.0, maximum=0.999, help="SGD momentum"),
    "weight_decay": Param(float, minimum=0.0, help="AdamW decoupled weight decay"),
    "key_bias_init": Param(
        float, minimum=0.0, help="std of the initial b_k entries in the bias study (0: PyTorch default)"
    ),
}



@dataclasses.dataclass(frozen=True)
class TrainingConfig(StudyConfig):
    """Every setting of notebook 04, validated once against `PARAMETERS`; defaults = the smoke profile."""

    PARAMETERS = PARAMETERS
    STUDY = "04_training"

    seeds: tuple[int, ...] = (0,)
    bias_seeds: tuple[int, ...] = (0,)
    steps: int = 6
    batch_size: int = 32
    eval_every: int = 3
    embed_dim: int = 16
    num_heads: int = 2
    num_layers: int = 1
    patch: int = 4
    pair_optimizers: tuple[str, ...] = ("sgd", "adam")
    optimizers: tuple[str, ...] = ("sgd", "sgd_momentum", "adam", "adamw", "adamw_bias_decay")
    adam_eps: tuple[float, ...] = (1e-8, 1e-12, 1e-6)
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    lr_sgd: float = 0.1
    lr_adam: float = 0.003
    momentum: float = 0.9
    weight_decay: float = 0.5
    key_bias_init: float = 0.3

    def check(self) -> None:
        try:
            check_model_config(embed_dim=self.embed_dim, num_heads=self.num_heads, num_layers=self.num_layers,
                               patch=self.patch)
        except ValueError as exc:
            raise ParameterError(f"{self.STUDY}: {exc}") from exc

    @property
    def arch(self) -> dict:
        return dict(embed_dim=self.embed_dim, num_heads=self.num_heads, num_layers=self.num_layers, patch=self.patch)

    def lr(self, optimizer: str) -> float:
        return optimizer_lr(optimizer, lr_sgd=self.lr_sgd, lr_adam=self.lr_adam, momentum=self.momentum)


# ----------------------------------------------------------------------------- probes


def _autocast(dtype: str):
    if dtype == "bfloat16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return nullcontext()


class _AttentionProbe:
    """Captures each attention layer's input and the gradient of its output (for tolerances)."""

    def __init__(self, model: nn.Module):
        self.inputs: dict[int, torch.Tensor] = {}
        self.out_grads: dict[int, torch.Tensor] = {}
        self.handles = []
        for i, mha in enumerate(attention_modules(model)):
            self.handles.append(mha.register_forward_hook(self._forward(i)))

    def _forward(self, i):
        def hook(module, args, output):
            self.inputs[i] = args[0].detach()
            if output[0].requires_grad:
                output[0].register_hook(lambda g: self.out_grads.__setitem__(i, g.detach()))
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def _qkv(mha: nn.MultiheadAttention, x: torch.Tensor, b_k: torch.Tensor | None = None):
    """Flat float32 q, k, v [B, L, E] of the layer on x (with `b_k` in place of its own), for the tolerances."""
    w_q, w_k, w_v = mha.in_proj_weight.detach().float().chunk(3)
    params = {"w_q": w_q, "w_k": w_k, "w_v": w_v, "b_q": mha.b_q.detach().float(),
              "b_k": (mha.b_k if b_k is None else b_k).detach().float(), "b_v": mha.b_v.detach().float()}
    return R.linear_projections(x.float(), x.float(), params)


def key_bias_gradient_tolerances(model: nn.Module, probe: _AttentionProbe, dtype: str) -> list[float]:
    """Per layer, `verdict.gradient_tolerance` for the b_k gradient of the last backward pass,
    from the measured query, value and upstream-gradient maxima of that pass."""
    tols = []
    for i, mha in enumerate(attention_modules(model)):
        x, g_out = probe.inputs[i], probe.out_grads[i]
        q, _, v = _qkv(mha, x)
        d = mha.head_dim
        # the output is y W_o^T + b_o, so the gradient reaching the attention output y is g_out W_o
        g_y = g_out.float() @ mha.out_proj.weight.detach().float()
        tols.append(verdict.gradient_tolerance(
            dtype, head_dim=d, n_queries=x.shape[0] * x.shape[1], n_keys=x.shape[1],
            query_abs_max=float(q.abs().max()), value_abs_max=float(v.abs().max()),
            upstream_abs_max=float(g_y.abs().max()),
        ))
    return tols


def _bias_vector(model: nn.Module, part: str) -> torch.Tensor:
    return torch.cat([getattr(m, part).detach().float().reshape(-1) for m in attention_modules(model)])


def _bias_grad(model: nn.Module, part: str) -> torch.Tensor:
    grads = []
    for m in attention_modules(model):
        g = getattr(m, part).grad
        grads.append(torch.zeros(m.embed_dim) if g is None else g.detach().float().reshape(-1))
    return torch.cat(grads)


def _shared_vector(model: nn.Module) -> torch.Tensor:
    """All parameters except b_k, flattened (the parameters a kept and a removed model share)."""
    return torch.cat([p.detach().reshape(-1) for n, p in model.named_parameters()
                      if not n.endswith("b_k")])


@torch.no_grad()
def correct(model: nn.Module, x: torch.Tensor, y: torch.Tensor, dtype: str = "float32") -> torch.Tensor:
    """Per image, whether the model classifies it correctly (a bool tensor, for paired comparisons)."""
    with _autocast(dtype):
        logits = model(x)
    return logits.argmax(dim=1) == y


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, dtype: str = "float32") -> float:
    return float(correct(model, x, y, dtype).float().mean())


# ----------------------------------------------------------------------------- training


@contextmanager
def single_thread():
    """Run the block with one intra-op thread, then restore the previous count.

    The model is tiny (tensors of a few thousand entries), so extra threads cost more in
    synchronization than they save, and on a shared machine they slow training several-fold (measured: a 2-thread step
    took 5-10x longer than a 1-thread step while other jobs ran).
    One thread also makes every reduction order, hence every rounding error, independent of
    the machine's core count, so the runs are bit-reproducible across machines."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _step(model, opt, x, y, dtype):
    opt.zero_grad(set_to_none=True)
    with _autocast(dtype):
        logits = model(x)
    loss = F.cross_entropy(logits.float(), y)
    loss.backward()
    return loss


def _with_single_thread(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with single_thread():
            return func(*args, **kwargs)
    return wrapper


@_with_single_thread
def train_pair(seed: int, *, optimizer: str, steps: int, batch_size: int, eval_every: int,
               embed_dim: int, num_heads: int, num_layers: int, patch: int,
               lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
               eps: float = DEFAULT_EPS, dtype: str = "float32", data=None) -> pd.DataFrame:
    """Train four models in lockstep on the same batches: b_k removed, b_k kept (both from
    the same seed), and two controls of the same kind: the removed model with every weight
    matrix moved up (`control`), or down (`control_down`), by one unit in the last place at
    step 0 (rounding-sized perturbations; two of them show how much the same run's chaos
    amplifies one rounding-sized difference more than another).

    Returns one row per step: the losses, the relative distance of the kept and of each control
    model's shared parameters from the removed model's, and (every `eval_every` steps and at the
    end) the test accuracy of the removed, kept and up-control models with the discordant-image
    counts against the removed model."""
    check_train_config(optimizer=optimizer, dtype=dtype, steps=steps, batch_size=batch_size, eps=eps)
    check_model_config(embed_dim=embed_dim, num_heads=num_heads, num_layers=num_layers, patch=patch)
    check_positive_int("eval_every", eval_every)
    data = load_digits_split() if data is None else data
    batches = batch_order(len(data["y_train"]), batch_size, steps, seed)
    arch = dict(embed_dim=embed_dim, num_heads=num_heads, num_layers=num_layers, patch=patch)
    models = {
        "removed": build_model(seed, keep_key_bias=False, **arch),
        "kept": build_model(seed, keep_key_bias=True, **arch),
        "control": build_model(seed, keep_key_bias=False, **arch),
        "control_down": build_model(seed, keep_key_bias=False, **arch),
    }
    with torch.no_grad():
        for key, towards in (("control", math.inf), ("control_down", -math.inf)):
            for p in models[key].parameters():
                if p.ndim >= 2:
                    p.copy_(torch.nextafter(p, torch.full_like(p, towards)))
    opts = {k: make_optimizer(m, optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay, eps=eps)
            for k, m in models.items()}
    rows = []
    for t in range(steps):
        x, y = data["x_train"][batches[t]], data["y_train"][batches[t]]
        row = {"step": t + 1}
        for k, m in models.items():
            loss = _step(m, opts[k], x, y, dtype).item()
            if k != "control_down":
                row[f"loss_{k}"] = loss
            opts[k].step()
        ref = _shared_vector(models["removed"])
        norm = float(ref.norm())
        row["param_divergence_kept"] = float((_shared_vector(models["kept"]) - ref).norm()) / norm
        row["param_divergence_control"] = float((_shared_vector(models["control"]) - ref).norm()) / norm
        row["param_divergence_control_down"] = float((_shared_vector(models["control_down"]) - ref).norm()) / norm
        if (t + 1) % eval_every == 0 or t + 1 == steps:
            hits = {k: correct(models[k], data["x_test"], data["y_test"], dtype)
                    for k in ("removed", "kept", "control")}
            for k, hit in hits.items():
                row[f"test_acc_{k}"] = float(hit.float().mean())
            # the discordant images of the paired comparison: right with one model only
            row["kept_only_correct"] = int((hits["kept"] & ~hits["removed"]).sum())
            row["removed_only_correct"] = int((hits["removed"] & ~hits["kept"]).sum())
            row["control_discordant"] = int((hits["control"] != hits["removed"]).sum())
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame.insert(0, "seed", seed)
    frame.insert(0, "dtype", dtype)
    frame.insert(0, "optimizer", optimizer)
    frame["lr"] = lr
    frame["eps"] = eps
    frame["n_test"] = len(data["y_test"])
    return frame


@_with_single_thread
def train_bias_run(seed: int, *, optimizer: str, steps: int, batch_size: int,
                   embed_dim: int, num_heads: int, num_layers: int, patch: int,
                   lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                   eps: float = DEFAULT_EPS, dtype: str = "float32", key_bias_init: float = 0.0,
                   data=None) -> tuple[pd.DataFrame, nn.Module]:
    """Train one model that keeps b_k and record, each step, the norms of b_q, b_k, b_v (all
    layers concatenated), the drift ||b_k(t) - b_k(0)||, the RMS and max of the b_k gradient
    and the per-layer rounding tolerance of that gradient (`verdict.gradient_tolerance`).
    Returns the trajectory and the trained model."""
    check_train_config(optimizer=optimizer, dtype=dtype, steps=steps, batch_size=batch_size, eps=eps)
    check_model_config(embed_dim=embed_dim, num_heads=num_heads, num_layers=num_layers, patch=patch)
    data = load_digits_split() if data is None else data
    batches = batch_order(len(data["y_train"]), batch_size, steps, seed)
    model = build_model(seed, keep_key_bias=True, key_bias_init=key_bias_init, embed_dim=embed_dim,
                        num_heads=num_heads, num_layers=num_layers, patch=patch)
    opt = make_optimizer(model, optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay, eps=eps)
    probe = _AttentionProbe(model)
    b_k0 = _bias_vector(model, "b_k").clone()
    rows = [{"step": 0, "norm_b_q": float(_bias_vector(model, "b_q").norm()),
             "norm_b_k": float(b_k0.norm()), "norm_b_v": float(_bias_vector(model, "b_v").norm()),
             "drift_b_k": 0.0}]
    try:
        for t in range(steps):
            x, y = data["x_train"][batches[t]], data["y_train"][batches[t]]
            loss = _step(model, opt, x, y, dtype)
            g_k, g_q = _bias_grad(model, "b_k"), _bias_grad(model, "b_q")
            tols = key_bias_gradient_tolerances(model, probe, dtype)
            e = attention_modules(model)[0].embed_dim
            ratio = max(float(g_k[i * e : (i + 1) * e].abs().max()) / tol for i, tol in enumerate(tols))
            opt.step()
            b_k = _bias_vector(model, "b_k")
            rows.append({
                "step": t + 1, "loss": loss.item(),
                "norm_b_q": float(_bias_vector(model, "b_q").norm()), "norm_b_k": float(b_k.norm()),
                "norm_b_v": float(_bias_vector(model, "b_v").norm()),
                "drift_b_k": float((b_k - b_k0).norm()),
                "grad_rms_b_k": float(g_k.pow(2).mean().sqrt()), "grad_rms_b_q": float(g_q.pow(2).mean().sqrt()),
                "grad_max_b_k": float(g_k.abs().max()), "grad_max_b_q": float(g_q.abs().max()),
                "grad_tolerance": max(tols),
                "grad_over_tolerance": ratio,
            })
    finally:
        probe.remove()
    frame = pd.DataFrame(rows)
    frame.insert(0, "seed", seed)
    frame.insert(0, "eps", eps)
    frame.insert(0, "dtype", dtype)
    frame.insert(0, "optimizer", optimizer)
    frame.insert(0, "setting", setting_label(optimizer, eps, dtype))
    frame["lr"] = lr
    frame["weight_decay"] = weight_decay if optimizer.startswith("adamw") else 0.0
    frame["n_bias"] = len(b_k0)
    frame["test_acc"] = np.nan
    frame.loc[frame.index[-1], "test_acc"] = accuracy(model, data["x_test"], data["y_test"], dtype)
    return frame, model


# ----------------------------------------------------------------------------- verdict at the end


@torch.no_grad()
def _attention_output(mha: nn.MultiheadAttention, x: torch.Tensor, b_q, b_k, b_v) -> torch.Tensor:
    """The attention output before the output projection (an identity projection is exact)."""
    e = mha.embed_dim
    xt = x.transpose(0, 1)
    eye = torch.eye(e, dtype=mha.out_proj.weight.dtype)
    y, _ = F.multi_head_attention_forward(
        xt, xt, xt, e, mha.num_heads, mha.in_proj_weight, torch.cat([b_q, b_k, b_v]), None, None, False,
        0.0, eye, torch.zeros(e), training=True, need_weights=False,
    )
    return y.transpose(0, 1).float()


@torch.no_grad()
def key_bias_verdicts(model: nn.Module, images: torch.Tensor, dtype: str = "float32") -> pd.DataFrame:
    """Does the trained b_k change the function? Per attention layer, on `images`: the change
    of the attention output when b_k is set to 0 (delta), against `verdict.output_tolerance`
    from the measured score and value maxima; the positive control moves b_v by the same
    vector instead. Also the change of the model's logits when every b_k is set to 0."""
    check_choice("dtype", dtype, TRAIN_DTYPES)
    probe = _AttentionProbe(model)
    try:
        with _autocast(dtype):
            logits = model(images).float()
    finally:
        probe.remove()
    rows = []
    mhas = attention_modules(model)
    for i, mha in enumerate(mhas):
        x = probe.inputs[i]
        b_q, b_k, b_v = mha.b_q.detach(), mha.b_k.detach(), mha.b_v.detach()
        zero = torch.zeros_like(b_k)
        with _autocast(dtype):
            y_kept = _attention_output(mha, x, b_q, b_k, b_v)
            y_zero = _attention_output(mha, x, b_q, zero, b_v)
            y_ctrl = _attention_output(mha, x, b_q, zero, b_v + b_k)
        delta = float((y_kept - y_zero).abs().max())
        control = float((y_ctrl - y_zero).abs().max())
        d, h = mha.head_dim, mha.num_heads
        s_max, v_max = 0.0, 0.0
        for bk in (b_k, zero):
            q, k, v = _qkv(mha, x, bk)
            qh = q.reshape(*q.shape[:2], h, d).abs().transpose(1, 2)
            kh = k.reshape(*k.shape[:2], h, d).abs().transpose(1, 2)
            s_max = max(s_max, float((qh @ kh.transpose(-1, -2)).max()) / math.sqrt(d))
            v_max = max(v_max, float(v.abs().max()))
        work = "bfloat16" if dtype == "bfloat16" else "float32"
        tol = verdict.output_tolerance(work, head_dim=d, n_keys=x.shape[1], score_abs_max=s_max,
                                       value_abs_max=v_max)
        rows.append({"layer": i, "norm_b_k": float(b_k.norm()), "delta": delta, "tolerance": tol,
                     "control_delta": control,
                     "verdict": verdict.classify(delta, tol, control_delta=control)})
    saved = [m.b_k.detach().clone() for m in mhas]
    try:
        for m in mhas:
            m.b_k.zero_()
        with _autocast(dtype):
            logits_zero = model(images).float()
    finally:
        for m, b in zip(mhas, saved, strict=True):
            m.b_k.copy_(b)
    frame = pd.DataFrame(rows)
    frame["logit_delta"] = float((logits - logits_zero).abs().max())
    frame["prediction_changes"] = int((logits.argmax(1) != logits_zero.argmax(1)).sum())
    return frame


# ----------------------------------------------------------------------------- studies


def study_settings(optimizers: list[str], adam_eps: list[float], dtypes: list[str]) -> list[dict]:
    """The bias-study settings: every optimizer in float32 (Adam once per eps value, the
    others at the default eps), and SGD and Adam (first eps) again under bfloat16 autocast
    for each non-float32 dtype. Validates every name before anything runs."""
    for name in optimizers:
        check_choice("optimizer", name, OPTIMIZERS)
    for dtype in dtypes:
        check_choice("dtype", dtype, TRAIN_DTYPES)
    for eps in adam_eps:
        if not (isinstance(eps, int | float) and eps > 0):
            raise ValueError(f"adam_eps entries must be positive, got {eps!r}")
    if not optimizers:
        raise ValueError("optimizers must not be empty")
    settings = []
    for name in optimizers:
        for eps in (adam_eps if name == "adam" else [DEFAULT_EPS]):
            settings.append({"optimizer": name, "eps": float(eps), "dtype": "float32"})
    for dtype in dtypes:
        if dtype == "float32":
            continue
        for name in ("sgd", "adam"):
            if name in optimizers:
                eps = adam_eps[0] if name == "adam" else DEFAULT_EPS
                settings.append({"optimizer": name, "eps": float(eps), "dtype": dtype})
    return settings


def setting_label(optimizer: str, eps: float, dtype: str) -> str:
    label = OPTIMIZER_LABELS[optimizer]
    if optimizer == "adam":
        label += f", eps={eps:.0e}"
    if dtype != "float32":
        label += f", {dtype}"
    return label


def run_pairs(cfg: TrainingConfig) -> pd.DataFrame:
    """`train_pair` for every optimizer in `cfg.pair_optimizers` and every seed (float32)."""
    data = load_digits_split()
    frames = []
    for name in cfg.pair_optimizers:
        for seed in cfg.seeds:
            frames.append(train_pair(
                seed, optimizer=name, steps=cfg.steps, batch_size=cfg.batch_size, eval_every=cfg.eval_every,
                **cfg.arch, lr=cfg.lr(name), momentum=cfg.momentum, weight_decay=cfg.weight_decay, data=data,
            ))
    return pd.concat(frames, ignore_index=True)


def run_bias_study(cfg: TrainingConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`train_bias_run` for every setting of `study_settings` and seed; then the end-of-training
    verdict (`key_bias_verdicts`, in float32 on the test images) for each trained model.
    Returns (trajectories, verdicts)."""
    settings = study_settings(list(cfg.optimizers), list(cfg.adam_eps), list(cfg.dtypes))
    data = load_digits_split()
    trajectories, verdicts = [], []
    for st in settings:
        for seed in cfg.bias_seeds:
            frame, model = train_bias_run(
                seed, optimizer=st["optimizer"], eps=st["eps"], dtype=st["dtype"], steps=cfg.steps,
                batch_size=cfg.batch_size, **cfg.arch, lr=cfg.lr(st["optimizer"]), momentum=cfg.momentum,
                weight_decay=cfg.weight_decay, key_bias_init=cfg.key_bias_init, data=data,
            )
            label = setting_label(st["optimizer"], st["eps"], st["dtype"])
            trajectories.append(frame)
            v = key_bias_verdicts(model, data["x_test"], "float32")
            for key, value in (("setting", label), ("optimizer", st["optimizer"]), ("eps", st["eps"]),
                               ("dtype", st["dtype"]), ("seed", seed)):
                v.insert(0, key, value)
            verdicts.append(v)
    verdict_frame = pd.concat(verdicts, ignore_index=True)
    verdict_frame["device"] = "cpu"
    return pd.concat(trajectories, ignore_index=True), verdict_frame


def pair_summary(curves: pd.DataFrame) -> pd.DataFrame:
    """Per optimizer and seed: the number of steps after which the kept and removed models are
    still bit-identical, final test accuracy with and without b_k, its binomial standard error, the
    largest step-by-step loss difference, the final parameter divergence of the kept model and of the
    two one-ulp controls from the removed model, and the discordant-image counts."""
    rows = []
    for (opt, seed), g in curves.groupby(["optimizer", "seed"], sort=False):
        last = g.iloc[-1]
        acc = float(last["test_acc_removed"])
        n = int(last["n_test"])
        rel = (g["loss_kept"] - g["loss_removed"]).abs() / g["loss_removed"].abs()
        moved = g.loc[g["param_divergence_kept"] > 0, "step"]
        rows.append({
            "optimizer": opt, "seed": int(seed), "steps": int(last["step"]),
            "identical_steps": int(moved.iloc[0]) - 1 if len(moved) else int(last["step"]),
            "test_acc_removed": acc, "test_acc_kept": float(last["test_acc_kept"]),
            "test_acc_control": float(last["test_acc_control"]),
            "acc_diff": abs(float(last["test_acc_kept"]) - acc),
            "acc_diff_control": abs(float(last["test_acc_control"]) - acc),
            "acc_standard_error": math.sqrt(max(acc * (1 - acc), 1.0 / n) / n),
            "max_loss_rel_diff": float(rel.max()),
            "max_loss_rel_diff_control": float(((g["loss_control"] - g["loss_removed"]).abs()
                                                / g["loss_removed"].abs()).max()),
            "final_divergence_kept": float(last["param_divergence_kept"]),
            "final_divergence_control": float(last["param_divergence_control"]),
            "final_divergence_control_down": float(last["param_divergence_control_down"]),
            "kept_only_correct": int(last["kept_only_correct"]),
            "removed_only_correct": int(last["removed_only_correct"]),
            "control_discordant": int(last["control_discordant"]),
            "n_test": n,
        })
    return pd.DataFrame(rows)


def bias_summary(trajectories: pd.DataFrame, *, momentum: float) -> pd.DataFrame:
    """Per setting and seed: the final norms, the measured drift of b_k, the Adam random-walk
    prediction (`predicted_adam_drift`, for Adam-family runs); for SGD runs the random walk that a
    b_k gradient of tolerance size per entry and step would make (`sgd_random_walk` of the per-step
    tolerances), the b_k drift over it, and b_q's drift over it (b_q starts at zero, so its final
    norm is its drift: the positive control, a gradient that is real); for AdamW with decay on
    biases the decayed initial norm (1 - lr wd)^T ||b_k(0)||.

    Gradient against tolerance: only steps where the b_q gradient (a bias that matters) exceeds the
    rounding tolerance can tell a real b_k gradient from noise ("powered" steps). Per run: their
    number, the largest |g_bk| / tolerance over them (NaN when there is none) and the median of
    tolerance / |g_bq| over them: a b_k gradient above that fraction of b_q's would have been seen."""
    rows = []
    for (label, seed), g in trajectories.groupby(["setting", "seed"], sort=False):
        first, last, steps = g.iloc[0], g.iloc[-1], g.iloc[1:]
        opt, lr, eps, n = last["optimizer"], float(last["lr"]), float(last["eps"]), int(last["n_bias"])
        row = {
            "setting": label, "optimizer": opt, "eps": eps, "dtype": last["dtype"], "seed": int(seed),
            "lr": lr, "steps": int(last["step"]), "test_acc": float(last["test_acc"]),
            "norm_b_q": float(last["norm_b_q"]), "norm_b_v": float(last["norm_b_v"]),
            "norm_b_k_initial": float(first["norm_b_k"]), "norm_b_k": float(last["norm_b_k"]),
            "drift_b_k": float(last["drift_b_k"]),
            "grad_rms_b_k": float(steps["grad_rms_b_k"].pow(2).mean() ** 0.5),
            "grad_rms_b_q": float(steps["grad_rms_b_q"].pow(2).mean() ** 0.5),
            "max_grad_over_tolerance": finite_max(steps["grad_over_tolerance"], f"{label} gradient ratios"),
            "predicted_drift": np.nan, "random_walk_drift": np.nan, "sgd_walk": np.nan,
            "decayed_norm": np.nan,
        }
        # a NaN step must raise, not drop out of the powered selection or the reductions
        require_finite(steps, ["grad_max_b_q", "grad_tolerance", "grad_over_tolerance"], f"{label} seed {seed} steps")
        powered = steps[steps["grad_max_b_q"] > steps["grad_tolerance"]]
        row["powered_steps"] = len(powered)
        row["max_grad_over_tolerance_powered"] = (finite_max(powered["grad_over_tolerance"], "gradient ratios")
                                                  if len(powered) else np.nan)
        row["detectable_gradient_fraction"] = (
            finite_median(powered["grad_tolerance"] / powered["grad_max_b_q"], "detectable fractions")
            if len(powered) else np.nan)
        if opt.startswith("adam"):
            sigma = steps["grad_rms_b_k"].to_numpy()
            row["predicted_drift"] = predicted_adam_drift(sigma, lr=lr, eps=eps, n_elements=n)
            row["random_walk_drift"] = random_walk_drift(sigma, lr=lr, eps=eps, n_elements=n)
        else:
            mu = momentum if opt == "sgd_momentum" else 0.0
            row["sgd_walk"] = sgd_random_walk(steps["grad_tolerance"].to_numpy(), lr=lr, momentum=mu,
                                              n_elements=n)
        if opt == "adamw_bias_decay":
            wd = float(last["weight_decay"])
            row["decayed_norm"] = (1.0 - lr * wd) ** row["steps"] * row["norm_b_k_initial"]
        rows.append(row)
    out = pd.DataFrame(rows)
    out["drift_over_predicted"] = out["drift_b_k"] / out["predicted_drift"]
    out["sgd_walk_ratio"] = out["drift_b_k"] / out["sgd_walk"]
    out["sgd_walk_ratio_b_q"] = out["norm_b_q"] / out["sgd_walk"]
    return out
