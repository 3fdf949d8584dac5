"""Timing what removing b_k saves in a transformer block at realistic sizes.

A block (`BLOCKS`: a BERT-base encoder layer, post-norm; a GPT-2 small block, pre-norm and
causal) is written out explicitly so that three implementations differ only in the work they
do (`IMPLEMENTATIONS`):

    with_bk     k = x W_k^T + b_k, every other bias present                    (A)
    without_bk  k = x W_k^T  (F.linear without bias: mm instead of addmm)      (B)
    control     a second, identical copy of A (the noise control)

B computes exactly A with b_k = 0, and A itself up to rounding, because softmax(s + c 1^T) =
softmax(s) row-wise and q . b_k is constant along each row. What disappears in B: in the
forward pass the broadcast of b_k into the key projection (B*S*E values written and read
again); in the backward pass the reduction of grad_k over batch and sequence (B*S*E values
read, one kernel); in the optimizer step the update of one tensor of E entries and the
zeroing of its gradient (`keybias.studies.cost.judge.removed_work` counts the bytes).

One repetition runs each implementation once, in a fresh random order, so load drifts hit
all alike. Repetitions continue past `min_reps` until the control's interval is narrow
enough (`target_half_width`), `max_reps` or its share of the time budget, whichever comes
first, so a slow or busy machine ends with wider intervals, not a longer run: the stopping rule
reads only the control's spread, never the saving, so it cannot steer the estimate of the
saving. `run_benchmark` shares one budget among the configurations, inference first: time
that a cheap configuration does not need goes to the expensive ones after it.
"""

from __future__ import annotations

import math
import os
import time

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from keybias.studies.cost.memory import make_optimizer
from keybias.studies.cost.stats import HEADLINE_PHASE, RATIOS, config_seed, half_width, summarize
from keybias.studies.fixtures import reference as R
from keybias.studies.params import check_choice, check_positive_int

ATTENTIONS = ("self", "cross")
PASSES = ("inference", "training")
CLOCKS = {"process": time.process_time, "wall": time.perf_counter}
PHASES = {"inference": ("forward",), "training": ("forward", "backward", "step", "total")}
IMPLEMENTATIONS = ("with_bk", "without_bk", "control")
# The fewest repetitions an interval is computed from: they always run, even past the budget.
MIN_REPS = 10
# Blocks from the published dimensions of the models they stand for; "tiny" is a test size only.
BLOCKS = {
    "BERT-base": dict(embed_dim=768, num_heads=12, ffn=3072, norm_first=False, causal=False),
    "GPT-2 small": dict(embed_dim=768, num_heads=12, ffn=3072, norm_first=True, causal=True),
    "tiny": dict(embed_dim=64, num_heads=2, ffn=256, norm_first=False, causal=False),
}


def _sync(device) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    elif str(device).startswith("mps"):
        torch.mps.synchronize()


# --------------------------------------------------------------------------- implementations


def block_params(layer: nn.TransformerEncoderLayer, *, key_bias: bool = True) -> dict:
    """Separate parameters copied from a real encoder layer (attention, MLP, two LayerNorms).

    key_bias=False drops b_k entirely (not zeroed: absent, so no add, no gradient, no update).
    The block then equals the layer with b_k = 0 exactly, and the layer itself up to
    rounding, because q . b_k shifts every score of a query row by the same amount.
    """
    attn = layer.self_attn
    e = attn.embed_dim
    w = attn.in_proj_weight.detach()
    b = attn.in_proj_bias.detach()
    p = {
        "w_q": w[:e], "w_k": w[e : 2 * e], "w_v": w[2 * e :], "b_q": b[:e], "b_k": b[e : 2 * e], "b_v": b[2 * e :],
        "w_o": attn.out_proj.weight, "b_o": attn.out_proj.bias,
        "w_1": layer.linear1.weight, "b_1": layer.linear1.bias, "w_2": layer.linear2.weight, "b_2": layer.linear2.bias,
        "ln1_w": layer.norm1.weight, "ln1_b": layer.norm1.bias, "ln2_w": layer.norm2.weight, "ln2_b": layer.norm2.bias,
    }
    if not key_bias:
        del p["b_k"]
    return {k: nn.Parameter(v.detach().clone()) for k, v in p.items()}


def block_forward(p: dict, x, memory=None, *, num_heads: int, norm_first: bool, causal: bool):
    """One transformer block, as nn.TransformerEncoderLayer(activation="gelu", dropout=0).

    memory=None: self-attention (causal if asked); otherwise the keys and values come from
    `memory` (cross-attention, never causal).
    """
    e = x.shape[-1]

    def attend(h):
        kv = h if memory is None else memory
        # the reference attention on PyTorch's fused kernel: what differs between the timed
        # implementations is the projections' work, with or without b_k
        return R.attention(h, kv, p, num_heads=num_heads, path="sdpa", causal=causal and memory is None)

    def mlp(h):
        return F.linear(F.gelu(F.linear(h, p["w_1"], p["b_1"])), p["w_2"], p["b_2"])

    def norm(h, i):
        return F.layer_norm(h, (e,), p[f"ln{i}_w"], p[f"ln{i}_b"])

    if norm_first:
        x = x + attend(norm(x, 1))
        return x + mlp(norm(x, 2))
    x = norm(x + attend(x), 1)
    return norm(x + mlp(x), 2)


def reference_layer(block: str, *, seed: int = 0, device="cpu", dtype=torch.float32) -> nn.TransformerEncoderLayer:
    """The real torch layer a block copies its weights from, with nonzero biases so b_k is really there."""
    check_choice("block", block, BLOCKS)
    cfg = BLOCKS[block]
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(cfg["embed_dim"], cfg["num_heads"], cfg["ffn"], dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=cfg["norm_first"], device=device, dtype=dtype)
    with torch.no_grad():
        layer.self_attn.in_proj_bias.normal_(0, 0.1)
        layer.self_attn.out_proj.bias.normal_(0, 0.1)
    return layer


def build_implementations(block: str, *, seed: int = 0, device="cpu", dtype=torch.float32) -> dict:
    """name -> parameter dict for every implementation; all share the same values."""
    layer = reference_layer(block, seed=seed, device=device, dtype=dtype)
    return {name: block_params(layer, key_bias=name != "without_bk") for name in IMPLEMENTATIONS}


# --------------------------------------------------------------------------- timing


def _step_function(params: dict, x, memory, upstream, cfg: dict, mode: str, optimizer: str, device, now):
    """A closure timing one step of one implementation; returns the phase times."""
    fwd_kw = dict(num_heads=cfg["num_heads"], norm_first=cfg["norm_first"], causal=cfg["causal"])
    if mode == "inference":
        def step():
            t0 = now()
            with torch.no_grad():
                block_forward(params, x, memory, **fwd_kw)
            _sync(device)
            return (now() - t0,)
        return step
    opt = make_optimizer(list(params.values()), optimizer)

    def step():
        t0 = now()
        y = block_forward(params, x, memory, **fwd_kw)
        loss = (y * upstream).sum()
        _sync(device)
        t1 = now()
        loss.backward()
        _sync(device)
        t2 = now()
        opt.step()
        opt.zero_grad(set_to_none=True)
        x.grad = None
        if memory is not None:
            memory.grad = None
        _sync(device)
        t3 = now()
        return (t1 - t0, t2 - t1, t3 - t2, t3 - t0)
    return step


def clock_for(device: str, clock: str) -> str:
    """The clock a device can be timed with: process CPU time cannot see GPU work, so GPUs use wall time."""
    check_choice("clock", clock, CLOCKS)
    return "wall" if str(device).startswith(("cuda", "mps")) else clock


def check_settings(*, min_reps: int, max_reps: int, budget_seconds: float, target_half_width: float) -> None:
    """Refuse inconsistent repetition settings before any work starts."""
    check_positive_int("min_reps", min_reps)
    check_positive_int("max_reps", max_reps)
    if min_reps < MIN_REPS:
        raise ValueError(f"min_reps={min_reps} must be >= {MIN_REPS}")
    if max_reps < min_reps:
        raise ValueError(f"max_reps={max_reps} must be >= min_reps={min_reps}")
    if not budget_seconds > 0:
        raise ValueError(f"budget_seconds={budget_seconds} must be positive")
    if not 0 <= target_half_width < 1:
        raise ValueError(f"target_half_width={target_half_width} must be in [0, 1)")


def time_block(
    *, block: str, seq_len: int, batch: int, attention: str, mode: str, min_reps: int = 30, max_reps: int = 30,
    max_seconds: float = math.inf, target_half_width: float = 0.0, check_every: int = 10, warmup: int = 2,
    min_rep_seconds: float = 0.0, optimizer: str = "adam", seed: int = 0, device="cpu", clock: str = "process",
) -> pd.DataFrame:
    """Interleaved timing of the three implementations at one configuration.

    Returns one row per (rep, implementation, phase) with seconds per step; `attrs["stopped_by"]`
    says which rule ended the repetitions ("target", "max_reps" or "max_seconds").

    Training steps treat the block as one inside a stack: its input (and memory) require a
    gradient, so the backward pass computes the input gradient as a real layer does.
    clock="process" reads the CPU time of this process: time it waits while other programs
    use the cores does not count (cache and bandwidth interference still do). Use "wall" on GPUs.
    """
    for n, v in (("seq_len", seq_len), ("batch", batch), ("min_reps", min_reps), ("max_reps", max_reps),
                 ("check_every", check_every), ("warmup", warmup)):
        check_positive_int(n, v)
    check_choice("block", block, BLOCKS)
    check_choice("attention", attention, ATTENTIONS)
    check_choice("mode", mode, PASSES)
    check_choice("optimizer", optimizer, ("adam", "sgd_momentum"))
    check_choice("clock", clock, CLOCKS)
    if max_reps < min_reps:
        raise ValueError(f"max_reps={max_reps} must be >= min_reps={min_reps}")
    if clock != clock_for(device, clock):
        raise ValueError(f"clock={clock!r} cannot see GPU work; use clock_for(device, clock)")
    now = CLOCKS[clock]
    cfg = BLOCKS[block]
    key = (device, block, attention, mode, seq_len, batch)
    impls = build_implementations(block, seed=seed, device=device)
    g = torch.Generator(device="cpu").manual_seed(config_seed(seed, "inputs", *key))
    shape = (batch, seq_len, cfg["embed_dim"])
    x = torch.randn(shape, generator=g).to(device).requires_grad_(mode == "training")
    memory = torch.randn(shape, generator=g).to(device).requires_grad_(mode == "training") if attention == "cross" else None
    upstream = torch.randn(shape, generator=g).to(device)
    steps = {name: _step_function(p, x, memory, upstream, cfg, mode, optimizer, device, now) for name, p in impls.items()}

    slowest = 0.0
    for name in IMPLEMENTATIONS:
        for _ in range(warmup):
            t = steps[name]()
        slowest = max(slowest, t[-1])
    inner = max(1, math.ceil(min_rep_seconds / max(slowest, 1e-9)))
    phases = PHASES[mode]
    headline = phases.index(HEADLINE_PHASE[mode])
    rng = np.random.default_rng(config_seed(seed, "order", *key))
    rows, times = [], {name: [] for name in IMPLEMENTATIONS}
    start, stopped_by, rep = time.perf_counter(), "max_reps", 0
    while rep < max_reps:
        for pos, i in enumerate(rng.permutation(len(IMPLEMENTATIONS))):
            name = IMPLEMENTATIONS[i]
            acc = np.zeros(len(phases))
            for _ in range(inner):
                acc += steps[name]()
            acc /= inner
            times[name].append(acc[headline])
            for ph, t in zip(phases, acc, strict=True):
                rows.append({"rep": rep, "position": pos, "implementation": name, "phase": ph, "seconds": t})
        rep += 1
        if rep < min_reps:
            continue
        if target_half_width > 0 and (rep - min_reps) % check_every == 0 and half_width(
                times["control"], times["with_bk"], seed=config_seed(seed, "stop", *key)) <= target_half_width:
            stopped_by = "target"
            break
        if time.perf_counter() - start >= max_seconds:
            stopped_by = "max_seconds"
            break
    frame = pd.DataFrame(rows)
    frame["inner"] = inner
    frame["clock"] = clock
    frame.attrs["stopped_by"] = stopped_by
    return frame


def block_configs(blocks, seq_lens, batch: int, attentions=ATTENTIONS, passes=PASSES) -> pd.DataFrame:
    """The grid of configurations: every block x sequence length x attention x pass."""
    for name, vals in (("blocks", blocks), ("seq_lens", seq_lens), ("attentions", attentions), ("passes", passes)):
        if not vals:
            raise ValueError(f"{name} must be a non-empty list")
    for b in blocks:
        check_choice("block", b, BLOCKS)
    for s in seq_lens:
        check_positive_int("seq_len", s)
    check_positive_int("batch", batch)
    for a in attentions:
        check_choice("attention", a, ATTENTIONS)
    for m in passes:
        check_choice("mode", m, PASSES)
    rows = [{"block": b, "attention": a, "mode": m, "embed_dim": BLOCKS[b]["embed_dim"], "num_heads": BLOCKS[b]["num_heads"],
             "ffn": BLOCKS[b]["ffn"], "seq_len": s, "batch": batch}
            for b in blocks for s in seq_lens for a in attentions for m in passes]
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- byte model inputs


def measure_machine(device="cpu", *, size_mb: int = 64, repeats: int = 5, embed_dim: int = 768, clock: str = "wall") -> dict:
    """Copy bandwidth (bytes/s, read+write counted) and the overhead of one small kernel."""
    check_choice("clock", clock, CLOCKS)
    now = CLOCKS[clock]
    src = torch.ones(size_mb * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 1):
        t0 = now()
        dst.copy_(src)
        _sync(device)
        times.append(now() - t0)
    bandwidth = 2 * src.nbytes / float(np.median(times[1:]))
    small = torch.ones(embed_dim, device=device)
    t = []
    for _ in range(repeats):
        t0 = now()
        for _ in range(200):
            small.sum(0)
        _sync(device)
        t.append((now() - t0) / 200)
    return {"bandwidth_bytes_per_s": bandwidth, "small_op_s": float(np.median(t))}


def optimizer_param_step_seconds(embed_dim: int, optimizer: str = "adam", device="cpu", repeats: int = 100,
                                 extra: int = 8, clock: str = "wall") -> float:
    """Measured marginal time one more parameter of embed_dim entries adds to an optimizer
    step (the update that removing b_k deletes): (t(1 + extra) - t(1)) / extra, medians of
    single steps, so the fixed per-call overhead of step() cancels."""
    check_choice("clock", clock, CLOCKS)
    now = CLOCKS[clock]

    def median_step(n: int) -> float:
        ps = [nn.Parameter(torch.zeros(embed_dim, device=device)) for _ in range(n)]
        opt = make_optimizer(ps, optimizer)
        t = []
        for _ in range(repeats):
            for p in ps:
                p.grad = torch.ones_like(p)
            t0 = now()
            opt.step()
            _sync(device)
            t.append(now() - t0)
        return float(np.median(t[10:]))

    return max(0.0, (median_step(1 + extra) - median_step(1)) / extra)


# --------------------------------------------------------------------------- the benchmark


def config_grid(cfg) -> pd.DataFrame:
    """`block_configs` of a `keybias.studies.cost.config.CostConfig`: its blocks, lengths, attentions and passes."""
    return block_configs(list(cfg.blocks), list(cfg.seq_lens), cfg.batch, list(cfg.attentions), list(cfg.passes))


def benchmark(configs: pd.DataFrame, cfg, *, device: str = "cpu", clock: str | None = None, log=None) -> dict:
    """`run_benchmark` of `configs` with the repetition, timing and seed settings of a
    `keybias.studies.cost.config.CostConfig`; `clock` defaults to `clock_for(device, cfg.clock)`."""
    return run_benchmark(
        configs, min_reps=cfg.min_reps, max_reps=cfg.max_reps, budget_seconds=cfg.budget_seconds,
        target_half_width=cfg.target_half_width, warmup=cfg.warmup, min_rep_seconds=cfg.min_rep_seconds,
        threads=cfg.threads, optimizer=cfg.optimizer, n_boot=cfg.n_boot, seed=cfg.seed, device=device,
        clock=clock_for(device, cfg.clock) if clock is None else clock, log=log)


def run_benchmark(
    configs: pd.DataFrame, *, min_reps=30, max_reps=30, budget_seconds=math.inf, target_half_width=0.0, warmup=2,
    min_rep_seconds=0.0, threads=1, optimizer="adam", n_boot=2000, seed=0, device="cpu", clock="process", log=None,
) -> dict:
    """Time every configuration of `configs` (see `block_configs`), inference first, within
    `budget_seconds` for all of them together (each gets an equal share of what is left).

    Returns DataFrames raw, medians, ratios, configs (with reps and the stopping rule) and a
    dict `machine` (threads, copy bandwidth, small-kernel overhead, one-parameter optimizer
    step per width): the inputs of the byte model.
    """

    check_choice("device", device, ("cpu", "cuda", "mps"))
    check_positive_int("threads", threads)
    check_settings(min_reps=min_reps, max_reps=max_reps, budget_seconds=budget_seconds,
                   target_half_width=target_half_width)
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' requested but torch.cuda.is_available() is False")
    if configs.empty:
        raise ValueError("no configurations to time")
    torch.set_num_threads(threads)
    # other programs' load explains a resolution missed on a shared machine, so it is recorded
    load_before = _load_average()
    raws, done = [], []
    ordered = configs.iloc[configs["mode"].map({"inference": 0, "training": 1}).argsort(kind="stable")]
    deadline = time.perf_counter() + budget_seconds
    for i, c in enumerate(ordered.itertuples(index=False)):
        t0 = time.perf_counter()
        share = max(0.0, (deadline - t0) / (len(ordered) - i))  # min_reps run even when it is spent
        raw = time_block(block=c.block, seq_len=int(c.seq_len), batch=int(c.batch), attention=c.attention, mode=c.mode,
                         min_reps=min_reps, max_reps=max_reps, max_seconds=share,
                         target_half_width=target_half_width, warmup=warmup, min_rep_seconds=min_rep_seconds,
                         optimizer=optimizer, seed=seed, device=device, clock=clock)
        for col, val in (("batch", c.batch), ("seq_len", c.seq_len), ("num_heads", c.num_heads), ("embed_dim", c.embed_dim),
                         ("mode", c.mode), ("attention", c.attention), ("block", c.block), ("device", device)):
            raw.insert(0, col, val)
        raws.append(raw)
        done.append({**c._asdict(), "device": device, "reps": int(raw["rep"].max()) + 1, "seconds_share": share,
                     "stopped_by": raw.attrs["stopped_by"], "seconds_spent": time.perf_counter() - t0})
        if log is not None:
            log(f"{c.block} {c.attention} {c.mode} S={c.seq_len}: {done[-1]['reps']} reps, "
                f"{done[-1]['stopped_by']}, {done[-1]['seconds_spent']:.0f} s")
    raw = pd.concat(raws, ignore_index=True)
    medians, ratios = summarize(raw, n_boot=n_boot, seed=seed)
    machine = measure_machine(device, clock=clock)
    machine.update(threads=torch.get_num_threads(), interop_threads=torch.get_num_interop_threads(), device=device,
                   clock=clock, load_average_before=load_before, load_average_after=_load_average(),
                   cores=os.cpu_count())
    machine["optimizer_param_step_s"] = {
        int(e): optimizer_param_step_seconds(int(e), optimizer, device, clock=clock) for e in configs["embed_dim"].unique()}
    return {"raw": raw, "medians": medians, "ratios": ratios, "configs": pd.DataFrame(done), "machine": machine}


def _load_average() -> float:
    """The one-minute load average (runnable processes), NaN where the OS has none."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return float("nan")


def device_status(device: str) -> pd.DataFrame:
    """Which devices the timing covered: the measured one, and cuda 'not run' with the reason."""
    rows = [{"device": device, "status": "measured", "reason": ""}]
    if device != "cuda":
        reason = "this run used DEVICE=" + device if torch.cuda.is_available() else "no CUDA GPU on this machine"
        rows.append({"device": "cuda", "status": "not run", "reason": reason})
    return pd.DataFrame(rows)


def not_run_rows(configs: pd.DataFrame, device: str, reason: str, per: str | None = "ratio") -> pd.DataFrame:
    """Rows for a device that was not run, with the reason: one per configuration and, with
    per="ratio" or "implementation", one per ratio or implementation."""

    out = configs[["block", "attention", "mode", "embed_dim", "num_heads", "seq_len", "batch"]].drop_duplicates()
    if per is not None:
        check_choice("per", per, ("ratio", "implementation"))
        values = list(RATIOS) if per == "ratio" else list(IMPLEMENTATIONS)
        out = out.merge(pd.DataFrame({per: values}), how="cross")
    out.insert(0, "device", device)
    out["status"], out["reason"] = "not run", reason
    return out


def with_not_run(frame: pd.DataFrame, configs: pd.DataFrame, device: str) -> pd.DataFrame:
    """The measured rows (status 'measured') plus `not_run_rows` for each device not run."""
    out = frame.copy()
    out["status"], out["reason"] = "measured", ""
    absent = device_status(device)
    absent = absent[absent["status"] == "not run"]
    per = "ratio" if "ratio" in out else "implementation" if "implementation" in out else None
    extra = [not_run_rows(configs, r.device, r.reason, per) for r in absent.itertuples()]
    if "ratio" in out and out["ratio"].nunique() == 1:
        extra = [x[x["ratio"] == out["ratio"].iloc[0]] for x in extra]
    return pd.concat([out, *extra], ignore_index=True) if extra else out
