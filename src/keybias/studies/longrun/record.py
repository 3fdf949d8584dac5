"""The full long-run grid of notebook 08: seeds x sizes x Adam regimes, run once by `make longrun-full`
and recorded as plain CSV files with a run record (commit, CPU, torch, threads, seconds).

The grid does not fit the notebook's budget (about 15 CPU-minutes at one thread per run on an idle core, several times that on a shared one), so the
notebook judges the recorded files in every build, as notebook 09 judges the recorded GPU profile,
while its own paper-profile run reproduces the direction at one size and seed.

The grid (`GRID`): two model sizes (`SIZES`), three seeds that no earlier analysis of this notebook
used (`SEEDS`), and three Adam regimes (`REGIMES`): float32 with eps = 1e-12 (far below the
gradient's rounding noise: Adam takes full-size steps on the noise), float32 with the default
eps = 1e-8 (above the noise: SGD-like steps lr g / eps) and bfloat16 autocast with the default eps
(the noise is about 2^16 times larger, above eps again). Every run trains on one thread, so a rerun
on the same machine is bit-identical; runs go in parallel processes (`--workers`).

Run: ``python -m keybias.studies.longrun.record --out recorded/longrun-cpu --commit SHA``
(``--quick`` for a seconds-long check of the whole path).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from keybias.studies.longrun import measure

# width, depth and heads; context and batch as the paper profile's long run
SIZES: dict[str, dict[str, int]] = {
    "small": dict(num_layers=1, embed_dim=32, num_heads=2, context=32),
    "medium": dict(num_layers=2, embed_dim=64, num_heads=4, context=32),
}
SEEDS = (21, 22, 23)  # fresh: the paper profile's long run is seed 3, its grid 0 and 1, the old pilot 5
# (dtype, eps, steps per size)
REGIMES = (
    ("float32", 1e-12, {"small": 20_000, "medium": 10_000}),
    ("float32", 1e-8, {"small": 20_000, "medium": 10_000}),
    ("bfloat16", 1e-8, {"small": 5_000, "medium": 5_000}),
)
COMMON = dict(batch_size=8, lr=1e-3, weight_decay=0.1, log_every=100, probe_every=2000, probe_batch=4)
QUICK = dict(steps=300, log_every=10, probe_every=100)

FILES = ("longrun_full_trajectory.csv", "longrun_full_probes.csv", "longrun_full_entries.csv",
         "longrun_full_times.csv")


def grid(quick: bool = False) -> list[dict]:
    """Every run of the full grid, longest first (so parallel workers finish together)."""
    runs = []
    for size, shape in SIZES.items():
        for dtype, eps, steps in REGIMES:
            for seed in SEEDS:
                run = dict(size=size, seed=seed, dtype=dtype, eps=eps, steps=steps[size], **shape, **COMMON)
                if quick:
                    run.update(QUICK)
                runs.append(run)
    cost = {"float32": 1.0, "bfloat16": 2.0}
    return sorted(runs, key=lambda r: -r["steps"] * r["embed_dim"] * r["num_layers"] * cost[r["dtype"]])


def one_run(run: dict) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    """`measure.train_run` for one grid entry; every frame gains the `size` column."""
    tokens = measure.split_tokens(measure.corpus()["bytes"])
    args = {k: v for k, v in run.items() if k not in ("size", "seed")}
    traj, probes, timing, entries = measure.train_run(run["seed"], tokens=tokens, role="full", **args)
    for frame in (traj, probes, entries):
        frame.insert(0, "size", run["size"])
        for key in ("num_layers", "embed_dim", "num_heads", "context"):
            frame[key] = run[key]
    timing = {"size": run["size"], **timing}
    return traj, probes, entries, timing


def _dirty() -> bool:
    """Whether tracked files differ from the commit (checked before the runs start)."""
    return bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=repository_root()).stdout.strip())


def machine_record(commit: str, workers: int, seconds: float, started: str, dirty: bool) -> dict:
    """Commit, CPU, torch, threads and wall seconds of the recording (the run record)."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        flags = Path("/proc/cpuinfo").read_text()
        isa = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "avx2") if f" {f}" in flags]
    except OSError:
        isa = []
    return {"commit": commit, "dirty": dirty, "cpu": cpu, "cpu_flags": isa, "torch": torch.__version__,
            "python": sys.version.split()[0], "threads_per_run": 1, "workers": workers,
            "cores": os.cpu_count(), "wall_seconds": round(seconds, 1), "started_utc": started,
            "capability": torch.backends.cpu.get_cpu_capability(),
            "env": {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")
                    if k in os.environ},
            "seeds": list(SEEDS), "sizes": SIZES, "regimes": [[d, e, s] for d, e, s in REGIMES],
            "command": "python -m keybias.studies.longrun.record " + " ".join(sys.argv[1:])}


def record(out: Path, *, commit: str, workers: int = 2, quick: bool = False) -> dict:
    """Run the grid with `workers` parallel one-thread processes; write the CSV files and run.json."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    dirty = _dirty()
    begin = time.perf_counter()
    runs = grid(quick)
    results = []
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(one_run, run): run for run in runs}
        for fut in concurrent.futures.as_completed(futures):
            run = futures[fut]
            results.append(fut.result())
            print(f"done {run['size']} {run['dtype']} eps={run['eps']:g} seed={run['seed']} "
                  f"({time.perf_counter() - begin:.0f} s)", flush=True)
    key = ["size", "dtype", "eps", "seed"]
    frames = [pd.concat([r[i] for r in results], ignore_index=True).sort_values(
        key + ["step", "layer"] + (["entry"] if i == 2 else []), kind="stable") for i in range(3)]
    times = pd.DataFrame([r[3] for r in results]).sort_values(key, kind="stable")
    for frame, name in zip([*frames, times], FILES, strict=True):
        frame.to_csv(out / name, index=False)
    meta = machine_record(commit, workers, time.perf_counter() - begin, started, dirty)
    meta["quick"] = quick
    (out / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def repository_root() -> Path:
    """The checkout this module runs from (src/keybias/studies/longrun/ sits four levels below it)."""
    return Path(__file__).resolve().parents[4]


def load_recorded(folder: Path) -> dict:
    """The recorded files: {"run": run record, "trajectory"/"probes"/"entries"/"times": DataFrame}.
    Raises FileNotFoundError naming every missing file before anything is judged."""
    folder = Path(folder)
    missing = [n for n in (*FILES, "run.json") if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder}: missing recorded files {missing} (make longrun-full writes them)")
    out = {"run": json.loads((folder / "run.json").read_text())}
    for name in FILES:
        out[name.removeprefix("longrun_full_").removesuffix(".csv")] = pd.read_csv(folder / name)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    meta = record(args.out, commit=args.commit, workers=args.workers, quick=args.quick)
    print(json.dumps({k: meta[k] for k in ("commit", "dirty", "cpu", "torch", "wall_seconds")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
