"""`make bench`: the full timing sweep of the cost study (machine-specific outputs).

The whole grid (blocks x sequence lengths x attentions x passes) lives here, outside `make
all`: its resolution depends on the machine, so it is reported, never a gate of the build. It
writes the same saving claim as notebook 06 (within the counted removed work), judged on the
whole grid, and each configuration's resolution."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from keybias.core import provenance
from keybias.core.recorder import atomic_write_text
from keybias.studies.cost import judge as cost_judge
from keybias.studies.cost import measure as cost_measure
from keybias.studies.cost import traffic as cost_traffic
from keybias.studies.cost.config import FULL_BENCH, QUICK_BENCH
from keybias.studies.cost.measure import CLOCKS
from keybias.studies.params import ParameterError, resolve_device


def bench_outputs(res: dict, device: str, optimizer: str, bounds=None) -> dict:
    """name -> DataFrame of what one benchmark run writes (all machine-specific but the GPU
    prediction and the counted saving bounds)."""
    model = cost_judge.predict_saving(res["ratios"], res["machine"], optimizer)
    configs = res["configs"]
    extra = {}
    if bounds is not None:
        extra["cost_bench_saving_bounds"] = bounds
        [claim], _, machine = cost_judge.saving_claims(model, bounds)
        extra["cost_bench_saving_claim"] = pd.DataFrame([{
            "id": claim.id, "value": claim.value, "bound": claim.bound, "holds": claim.holds,
            "statement": claim.statement, "bound_origin": claim.bound_origin, **machine}])
    return {
        **extra,
        "cost_bench_resolution": cost_judge.resolution_table(res["ratios"], configs),
        "cost_bench_medians": cost_measure.with_not_run(res["medians"], configs, device),
        "cost_bench_ratios": cost_measure.with_not_run(res["ratios"], configs, device),
        "cost_bench_model": cost_measure.with_not_run(model, configs, device),
        "cost_bench_verdicts": cost_judge.verdict_table(model),
        "cost_bench_configs": configs,
        "cost_bench_devices": cost_measure.device_status(device),
        "cost_bench_gpu_prediction": cost_judge.gpu_prediction(configs, optimizer=optimizer),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keybias.studies.cost.bench", description="Key-bias timing benchmark (machine-specific).")
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
    # the counted bound runs one step per implementation on the CPU (it counts kernels, times nothing)
    bounds = cost_traffic.saving_bounds(configs, spec["optimizer"], spec["seed"])
    for name, frame in bench_outputs(res, device, spec["optimizer"], bounds).items():
        atomic_write_text(args.out / f"{name}.csv", frame.to_csv(index=False, float_format="%.9g"))

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
