"""What the key bias costs: parameters, optimizer memory and time (notebook 06, `make bench`).

The study is split along its layers:

- `keybias.cost_memory`: exact counts of what b_k occupies, checked against real modules;
- `keybias.cost_measure`: transformer blocks at BERT-base and GPT-2 small sizes with and
  without b_k, timed interleaved against an identical control (returns DataFrames);
- `keybias.cost_stats`: paired ratio estimators and bootstrap intervals (pure);
- `keybias.cost_judge`: the byte model of the removed work, the GPU prediction, claims and
  macros (pure: DataFrames in, so tests can hand it doctored data);
- `keybias.cost_show`: the paper's tables and the figure.

This module declares the notebook's parameters and the machine-specific outputs, and runs
the full benchmark from the command line (`make bench`):
``python -m keybias.cost --full --device cpu --out results/machine``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from keybias import cost_judge, cost_measure
from keybias.cost_measure import ATTENTIONS, BLOCKS, CLOCKS, PASSES
from keybias.params import Param

PARAMETERS = {
    "blocks": Param(str, many=True, choices=tuple(BLOCKS), help="transformer blocks timed (tiny is a test size)"),
    "seq_lens": Param(int, many=True, positive=True, help="sequence lengths (keys and queries)"),
    "batch": Param(int, positive=True, help="batch size"),
    "attentions": Param(str, many=True, choices=ATTENTIONS, help="self or cross attention"),
    "passes": Param(str, many=True, choices=PASSES, help="inference (forward) and/or a training step"),
    "min_reps": Param(int, minimum=30, help="interleaved repetitions per configuration, at least"),
    "max_reps": Param(int, minimum=30, help="repetitions per configuration, at most"),
    "budget_seconds": Param(float, positive=True,
                            help="timing budget of all configurations together (min_reps always run)"),
    "target_half_width": Param(float, minimum=0.0, maximum=1.0,
                               help="stop once the control's interval half-width is this small (0: never early)"),
    "resolution_bound": Param(float, positive=True, maximum=1.0,
                              help="claimed bound on the median control half-width (issue 12: 0.01)"),
    "warmup": Param(int, minimum=1, help="warm-up steps per implementation"),
    "min_rep_seconds": Param(float, minimum=0.0, help="each repetition loops a step until this long"),
    "threads": Param(int, positive=True, help="torch.set_num_threads value (pinned, recorded)"),
    "clock": Param(str, choices=tuple(CLOCKS), help="process CPU time (robust to a shared machine) or wall time"),
    "optimizer": Param(str, choices=("adam", "sgd_momentum"), help="optimizer of the training step"),
    "n_boot": Param(int, minimum=200, help="bootstrap resamples per interval"),
    "seed": Param(int, minimum=0, help="base seed of weights, inputs, order and bootstrap (per-configuration seeds derive from it)"),
    "architecture_check": Param(str, choices=("transformers", "torch"),
                                help="real modules the counts are checked against (transformers models, or torch.nn blocks)"),
}

# Outputs whose values depend on the machine (timings); verification against committed
# results must skip them. Paths relative to results/.
MACHINE_SPECIFIC_OUTPUTS = [
    "machine/cost_*",
    "figures/cost_time_saving.pdf",
    "figures/cost_time_saving.png",
    "tables/cost_timing*.tex",
    "macros/06_cost.tex",  # mixes exact memory counts with timing numbers
    "steps/06_cost.json",  # timing claims carry measured values
    # where timings lived before results/machine/ existed: stale copies must never be compared
    "data/cost_timing*.csv",
    "data/cost_bench*",
]

# `make bench`: every block, both sequence lengths, both attentions, both passes.
FULL_BENCH = dict(blocks=["BERT-base", "GPT-2 small"], seq_lens=[128, 512], batch=8, attentions=list(ATTENTIONS),
                  passes=list(PASSES), min_reps=30, max_reps=400, budget_seconds=7200.0, target_half_width=0.008,
                  warmup=3, min_rep_seconds=0.0, optimizer="adam", n_boot=4000, seed=0, clock="process")
QUICK_BENCH = dict(FULL_BENCH, blocks=["tiny"], seq_lens=[16], batch=2, max_reps=30, budget_seconds=5.0,
                   target_half_width=0.0, n_boot=500)


def bench_outputs(res: dict, device: str, optimizer: str) -> dict:
    """name -> DataFrame of what one benchmark run writes (all machine-specific but the GPU prediction)."""
    model = cost_judge.predict_saving(res["ratios"], res["machine"], optimizer)
    configs = res["configs"]
    return {
        "cost_bench_medians": cost_measure.with_not_run(res["medians"], configs, device),
        "cost_bench_ratios": cost_measure.with_not_run(res["ratios"], configs, device),
        "cost_bench_model": cost_measure.with_not_run(model, configs, device),
        "cost_bench_verdicts": cost_judge.verdict_table(model),
        "cost_bench_configs": configs,
        "cost_bench_devices": cost_measure.device_status(device),
        "cost_bench_gpu_prediction": cost_judge.gpu_prediction(configs, optimizer=optimizer),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keybias.cost", description="Key-bias timing benchmark (machine-specific).")
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--full", action="store_true",
                      help="BERT-base and GPT-2 small blocks, S=128 and 512, self/cross, inference/training (hours on one core)")
    size.add_argument("--quick", action="store_true", help="a tiny block to check the command works (seconds)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, mps or auto (default cpu)")
    parser.add_argument("--out", default="results/machine", type=Path, help="output folder (default results/machine)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="process",
                        help="process CPU time (default; robust on a shared machine) or wall time; GPUs always use wall")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores torch sees)")
    parser.add_argument("--budget-seconds", type=float, default=None,
                        help="timing budget of the whole grid (default 7200; min_reps always run)")
    args = parser.parse_args(argv)
    from keybias.export import atomic_write_text
    from keybias.params import ParameterError, resolve_device

    try:
        device = resolve_device(args.device)
    except ParameterError as exc:
        parser.error(str(exc))
    threads = args.threads if args.threads is not None else torch.get_num_threads()
    if threads <= 0:
        parser.error(f"--threads must be positive, got {threads}")
    if args.budget_seconds is not None and args.budget_seconds <= 0:
        parser.error(f"--budget-seconds must be positive, got {args.budget_seconds}")
    spec = dict(FULL_BENCH if args.full else QUICK_BENCH, threads=threads, device=device,
                clock=cost_measure.clock_for(device, args.clock))
    if args.budget_seconds is not None:
        spec["budget_seconds"] = args.budget_seconds
    grid = {k: spec.pop(k) for k in ("blocks", "seq_lens", "batch", "attentions", "passes")}
    configs = cost_measure.block_configs(**grid)
    t0 = time.time()
    res = cost_measure.run_benchmark(configs, **spec, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    wall = time.time() - t0
    for name, frame in bench_outputs(res, device, spec["optimizer"]).items():
        atomic_write_text(args.out / f"{name}.csv", frame.to_csv(index=False, float_format="%.9g"))
    from keybias import provenance

    prov = {
        "machine_specific": True,
        "bench": "full" if args.full else "quick",
        "grid": grid,
        "spec": spec,
        "wall_seconds": wall,
        "measured": res["machine"],
        **provenance.collect(Path.cwd()),
    }
    atomic_write_text(args.out / "cost_bench_provenance.json", json.dumps(prov, indent=2, default=str) + "\n")
    print(f"wrote {args.out}/cost_bench_*.csv and cost_bench_provenance.json in {wall:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
