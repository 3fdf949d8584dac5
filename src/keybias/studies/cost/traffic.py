"""The most that removing b_k can save, from the work one step does (no clock involved).

Every kernel a CPU step launches costs a fixed overhead plus its bytes over the memory
bandwidth, plus its arithmetic; the removed kernels (the bias broadcast, the reduction of
grad b_k, the optimizer's update of b_k) do no heavy arithmetic. Write the step's time as
n*c + T/w + F (n kernels, T bytes, F the time of the arithmetic) and the removed part as
n_r*c + R/w. By the mediant inequality, whatever the overhead c and the bandwidth w,

    saving = (n_r*c + R/w) / (n*c + T/w + F)  <=  max(n_r/n, R/T),

so the larger of the removed share of kernels and the removed share of bytes bounds the
saving on any machine, as long as the removed kernels cost no more per launch and per byte
than the step's average kernel. Both shares are counted, not timed: one step of each
implementation runs under a dispatch mode that records every ATen operation with the bytes
of its tensor arguments and results (views, reshapes and profiler marks move no data and are skipped).
"""

from __future__ import annotations

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from keybias.studies.cost.measure import BLOCKS, _step_function, build_implementations
from keybias.studies.cost.stats import config_seed

_ADDMM = (torch.ops.aten.addmm.default, torch.ops.aten.addmm.out)
# reshapes that return a new tensor header on the same data (not flagged as views) move no data
_NO_DATA = (torch.ops.aten._unsafe_view.default,)


def _nbytes(tree) -> int:
    return sum(t.numel() * t.element_size() for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor))


class _Work(TorchDispatchMode):
    """Counts kernels and the bytes their tensor arguments and results occupy."""

    def __init__(self):
        super().__init__()
        self.kernels = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not (func.is_view or func in _NO_DATA or func.namespace == "profiler"):
            self.kernels += 1
            self.bytes += _nbytes((args, kwargs)) + _nbytes(out)
            if func in _ADDMM:
                # addmm first writes its broadcast bias into the result (one more loop), then the
                # GEMM reads it back with beta=1: the work a bias-free mm does not do
                self.kernels += 1
                self.bytes += 2 * _nbytes(out)
        return out


def step_work(*, block: str, seq_len: int, batch: int, attention: str, mode: str, optimizer: str = "adam",
              seed: int = 0) -> dict:
    """Kernels and bytes of one step of each implementation (after one warm-up step, so
    the optimizer's state exists), and the removed shares and their maximum."""
    cfg = BLOCKS[block]
    impls = build_implementations(block, seed=seed)
    g = torch.Generator().manual_seed(config_seed(seed, "traffic", block, attention, mode, seq_len, batch))
    shape = (batch, seq_len, cfg["embed_dim"])
    train = mode == "training"
    work = {}
    for name in ("with_bk", "without_bk"):
        x = torch.randn(shape, generator=g).requires_grad_(train)
        memory = torch.randn(shape, generator=g).requires_grad_(train) if attention == "cross" else None
        upstream = torch.randn(shape, generator=g)
        step = _step_function(impls[name], x, memory, upstream, cfg, mode, optimizer, "cpu", lambda: 0.0)
        step()
        with _Work() as counted:
            step()
        work[name] = counted
    a, b = work["with_bk"], work["without_bk"]
    kernel_share = (a.kernels - b.kernels) / a.kernels
    byte_share = (a.bytes - b.bytes) / a.bytes
    return {"kernels_with_bk": a.kernels, "kernels_without_bk": b.kernels, "bytes_with_bk": a.bytes,
            "bytes_without_bk": b.bytes, "removed_kernel_share": kernel_share, "removed_byte_share": byte_share,
            "saving_bound": max(kernel_share, byte_share)}


def saving_bounds(configs: pd.DataFrame, optimizer: str = "adam", seed: int = 0) -> pd.DataFrame:
    """`step_work` for every configuration of `configs` (see `measure.block_configs`)."""
    if configs.empty:
        raise ValueError("no configurations to count")
    rows = []
    for c in configs.itertuples(index=False):
        rows.append({"block": c.block, "attention": c.attention, "mode": c.mode, "embed_dim": int(c.embed_dim),
                     "seq_len": int(c.seq_len), "batch": int(c.batch),
                     **step_work(block=c.block, seq_len=int(c.seq_len), batch=int(c.batch), attention=c.attention,
                                 mode=c.mode, optimizer=optimizer, seed=seed)})
    out = pd.DataFrame(rows)
    if not (out["saving_bound"] > 0).all():
        raise ValueError(f"a configuration removes no counted work:\n{out}")
    return out
