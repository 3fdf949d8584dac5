"""make bench-surgery: time and peak memory of the surgery tool at the sizes people have.

For each size (BERT-base, GPT-2-medium, OPT-1.3B and OPT-6.7B shapes, random weights, biases
randomised) scripts/write_random_checkpoint.py writes a safetensors checkpoint to a scratch
folder, one tensor at a time, in shards of at most 5 GB (save_pretrained's layout: one
model.safetensors where it fits in one shard, else shards and model.safetensors.index.json).
Then, in fresh processes, one measurement each, so that every peak is its own:

* floor: read every shard and write it back (safetensors load_file/save_file), the least any
  tool that rewrites the checkpoint must do;
* forward: the median of five forward passes before the tools and five after, of the loaded model
  on the tool's example inputs;
* library: strip_key_bias then fold_value_bias on the loaded model (peak memory over the
  model's own bytes, time in forward passes); left out where the model in memory would take
  more than LIBRARY_LIMIT_GB, the share of this machine's memory a bench may use;
* cli: python -m keybias.surgery IN OUT --fold-value --allow-dropout (wall time over the floor's; peak memory
  over the largest shard plus one layer). A sharded checkpoint is streamed shard by shard, each
  byte read once and written once, each changed module certified as soon as its tensors are
  read; a single file is loaded whole.

Peak memory is the process's peak resident set (VmHWM, reset with /proc/self/clear_refs after
the model is loaded, for the library row; the CLI's from wait4). Writes
results/machine/surgery_bench.csv and .md with the commit and machine: machine outputs, not
compared across machines. Not part of CI: it takes about half an hour and ~30 GB of scratch disk.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
FORWARDS = 5  # forward passes timed; their median is the unit of the strip time
SHARD_GB = 5.0
LIBRARY_LIMIT_GB = 12.0  # this machine's memory is shared; a model larger than this is not loaded whole
COLUMNS = """Columns: forward s is the median of {forwards} forward passes before and {forwards} after the tools, of
the loaded model on the tool's example inputs (2 x 8 tokens); strip s is strip_key_bias on that model, also given as a number of
such forward passes; library peak is the process's peak resident set during strip and fold
(Python, torch and transformers included), and its ratio to the model's parameter bytes; the
floor reads every shard and writes it back with safetensors; CLI is `python -m keybias.surgery IN
OUT --fold-value --allow-dropout` as a whole (import, plan or load, strip, fold, certify, write, check of the
written files), its mode "per shard" for a sharded checkpoint (each shard streamed once, each
changed module certified on its own as its tensors are read) or "whole" for a single file
(loaded whole), its peak the process's peak resident set, also over the largest shard plus one
layer. A dash: not measured (the library rows need the model in memory, above
{limit:g} GB here). The machine is shared with other jobs, so single timings are noisy."""

# name -> (shape of scripts/write_random_checkpoint.py, dtype)
SIZES = {
    "110M": ("bert-base", "float32"),
    "355M": ("gpt2-medium", "float32"),
    "1.3B": ("opt-1.3b", "float32"),
    "6.7B": ("opt-6.7b", "bfloat16"),
}
LAYER_ZERO = re.compile(r"(^|\.)(layers|layer|h)\.0\.")


def _peak_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _build(size: str, out: Path) -> dict:
    from write_random_checkpoint import write

    shape, dtype = SIZES[size]
    return write(out, shape, dtype, SHARD_GB)


def _layout(folder: Path) -> dict:
    """Bytes of the largest shard and of one layer (the tensors of layer 0)."""
    shards, layer = [], 0
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            table = json.loads(f.read(n))
        sizes = {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in table.items() if k != "__metadata__"}
        shards.append(sum(sizes.values()))
        layer += sum(b for k, b in sizes.items() if LAYER_ZERO.search(k))
    return {"largest_shard_bytes": max(shards), "layer_bytes": layer, "shards": len(shards),
            "sharded": (folder / "model.safetensors.index.json").exists()}


def _floor(folder: Path) -> dict:
    from safetensors.torch import load_file, save_file

    scratch = Path(tempfile.mkdtemp(dir=folder.parent, prefix="floor-"))
    start = time.perf_counter()
    for shard in sorted(folder.glob("*.safetensors")):
        tensors = load_file(str(shard))
        save_file(tensors, str(scratch / shard.name), metadata={"format": "pt"})
        del tensors
    seconds = time.perf_counter() - start
    shutil.rmtree(scratch)
    return {"seconds": seconds, "peak_bytes": _peak_bytes()}


def _load(folder: Path):
    import transformers

    transformers.utils.logging.set_verbosity_error()
    return transformers.AutoModel.from_pretrained(str(folder), local_files_only=True, use_safetensors=True).eval()


def _library(folder: Path) -> dict:
    import warnings

    import torch

    from keybias import surgery
    from keybias.surgery import _calls

    model = _load(folder)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    inputs = _calls.example_inputs(model)

    def forwards() -> list[float]:
        times = []
        with torch.no_grad():
            for _ in range(FORWARDS):
                start = time.perf_counter()
                _calls.run_model(model, inputs)
                times.append(time.perf_counter() - start)
        return times

    with torch.no_grad():
        _calls.run_model(model, inputs)  # warm up
    times = forwards()
    _reset_peak()
    base = _peak_bytes()
    start = time.perf_counter()
    strip = surgery.strip_key_bias(model)
    strip_s = time.perf_counter() - start
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", surgery.FullyMaskedRowWarning)
        fold = surgery.fold_value_bias(model, allow_dropout=True)
    fold_s = time.perf_counter() - start
    peak = _peak_bytes()
    # forward passes timed before and after the tools, so that a change of the machine's load
    # during the run moves the unit as much as the strip; the median of all of them
    times += forwards()
    forward = sorted(times)[len(times) // 2]
    return {"model_bytes": model_bytes, "forward_s": forward, "strip_s": strip_s, "fold_s": fold_s,
            "peak_bytes": peak, "rss_before_bytes": base, "params": sum(p.numel() for p in model.parameters()),
            "changed": len(strip["modules_changed"]) + len(fold["modules_changed"]),
            "whole_model_holds": bool(strip.get("whole_model", {}).get("holds")) and bool(
                fold.get("whole_model", {}).get("holds"))}


def _child(args: list[str]) -> dict:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]} failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cli(folder: Path) -> dict:
    out = folder.parent / "out"
    log = folder.parent / "cli.log"
    start = time.perf_counter()
    with log.open("w") as sink:
        child = subprocess.Popen([sys.executable, "-m", "keybias.surgery", str(folder), str(out), "--fold-value",
                                  "--allow-dropout"],
                                 stdout=sink, stderr=subprocess.STDOUT)
        _pid, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    shutil.rmtree(out, ignore_errors=True)
    lines = log.read_text().strip().splitlines()
    return {"seconds": seconds, "peak_bytes": usage.ru_maxrss * 1024, "exit": code,
            "error": lines[-1] if code and lines else ""}


def _machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next((int(line.split()[1]) // 2**20 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), 0)
    return f"{cpu}, {os.cpu_count()} cores, {mem} GiB"


def _fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] in ("build", "floor", "library"):
        what, folder = sys.argv[1], Path(sys.argv[2])
        if what == "build":
            print(json.dumps(_build(sys.argv[3], folder)))
        else:
            print(json.dumps(_floor(folder) if what == "floor" else _library(folder)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "machine")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    rows, load_start = [], os.getloadavg()[0]
    gb = 1e9
    for size in args.sizes:
        work = Path(tempfile.mkdtemp(dir=args.scratch, prefix=f"keybias-bench-{size}-"))
        try:
            folder = work / "in"
            built = _child(["build", str(folder), size])
            layout = _layout(folder)
            floor = _child(["floor", str(folder)])
            lib = _child(["library", str(folder)]) if built["bytes"] <= LIBRARY_LIMIT_GB * gb else None
            cli = _cli(folder)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        model_bytes = built["bytes"]
        allowance = layout["largest_shard_bytes"] + layout["layer_bytes"]
        row = {"size": size, "dtype": SIZES[size][1], "parameters": lib["params"] if lib else None,
               "model_gb": model_bytes / gb, "shards": layout["shards"],
               "largest_shard_gb": layout["largest_shard_bytes"] / gb, "layer_gb": layout["layer_bytes"] / gb,
               "forward_s": lib["forward_s"] if lib else None, "strip_s": lib["strip_s"] if lib else None,
               "fold_s": lib["fold_s"] if lib else None,
               "strip_forward_passes": lib["strip_s"] / lib["forward_s"] if lib else None,
               "library_peak_gb": lib["peak_bytes"] / gb if lib else None,
               "library_peak_over_model": lib["peak_bytes"] / lib["model_bytes"] if lib else None,
               "floor_s": floor["seconds"], "floor_peak_gb": floor["peak_bytes"] / gb,
               "cli_mode": "per shard" if layout["sharded"] else "whole",
               "cli_s": cli["seconds"], "cli_over_floor": cli["seconds"] / floor["seconds"],
               "cli_peak_gb": cli["peak_bytes"] / gb, "cli_peak_over_model": cli["peak_bytes"] / model_bytes,
               "cli_peak_over_shard_and_layer": cli["peak_bytes"] / allowance,
               "cli_exit": cli["exit"], "cli_error": cli["error"],
               "whole_model_holds": lib["whole_model_holds"] if lib else None}
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    import csv

    with (args.out / "surgery_bench.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    load = f"1-minute load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    lines = [f"# make bench-surgery (commit {commit}, {_machine()}, {time.strftime('%Y-%m-%d')})", "", load + ".", "",
             "| size | dtype | model GB (shards) | forward s | strip s (forward passes) | fold s "
             "| library peak GB (x model) | read+write floor s | CLI mode | CLI s (x floor) "
             "| CLI peak GB (x model; x largest shard + one layer) | CLI exit |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        strip = "–" if r["strip_s"] is None else f"{r['strip_s']:.2f} ({r['strip_forward_passes']:.1f})"
        peak = "–" if r["library_peak_gb"] is None else f"{r['library_peak_gb']:.2f} ({r['library_peak_over_model']:.2f})"
        lines.append(f"| {r['size']} | {r['dtype']} | {r['model_gb']:.2f} ({r['shards']}) | {_fmt(r['forward_s'], '.2f')} "
                     f"| {strip} | {_fmt(r['fold_s'], '.2f')} | {peak} | {r['floor_s']:.1f} | {r['cli_mode']} "
                     f"| {r['cli_s']:.1f} ({r['cli_over_floor']:.2f}) | {r['cli_peak_gb']:.2f} "
                     f"({r['cli_peak_over_model']:.2f}; {r['cli_peak_over_shard_and_layer']:.2f}) | {r['cli_exit']} |")
    lines += ["", COLUMNS.format(forwards=FORWARDS, limit=LIBRARY_LIMIT_GB)]
    failed = [r for r in rows if r["cli_exit"]]
    lines += [f"\n{r['size']}: the CLI failed: {r['cli_error']}" for r in failed]
    (args.out / "surgery_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
