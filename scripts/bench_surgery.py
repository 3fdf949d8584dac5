"""make bench-surgery: time and peak memory of the surgery tool at the sizes people have.

For each size (BERT-base, GPT-2-medium and OPT-1.3B shapes, random weights built from configs,
biases randomised) this writes a safetensors checkpoint to a scratch folder, then measures in
fresh processes, one measurement each, so that every peak is its own:

* floor: read every shard and write it back (safetensors), the least any tool that rewrites
  the checkpoint must do;
* forward: the median of five forward passes of the loaded model on the tool's example inputs;
* library: strip_key_bias then fold_value_bias on the loaded model (peak memory over the
  model's own bytes, time in forward passes);
* cli: python -m keybias.surgery IN OUT --fold-value (wall time over the floor's).

Peak memory is the process's peak resident set (VmHWM, reset with /proc/self/clear_refs after
the model is loaded, for the library row). Writes results/machine/surgery_bench.csv and .md
with the commit and machine. Not part of CI: the 1.3B size takes minutes and ~16 GB of disk.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORWARDS = 5  # forward passes timed; their median is the unit of the strip time
# Sizes the default run leaves out, and why (written as "not run" rows).
NOT_RUN = {"6.7B": ("bfloat16", "the command line loads the whole model (transformers' from_pretrained) rather "
                    "than streaming its shards, and this script builds its random checkpoint through a float32 "
                    "model (27 GB, more than this machine's memory); shard-by-shard processing is not implemented")}
COLUMNS = """Columns: forward s is the median of {forwards} forward passes of the loaded model on the tool's
example inputs (2 x 8 tokens); strip s is strip_key_bias on that model, also given as a number of
such forward passes; library peak is the process's peak resident set during strip and fold
(Python, torch and transformers included), and its ratio to the model's parameter bytes; the
floor reads every shard and writes it back with safetensors; CLI is `python -m keybias.surgery IN
OUT --fold-value` as a whole (import, load, strip, fold, write, read-back), its peak the child's
peak resident set. The machine is shared with other jobs, so single timings are noisy."""

# name -> (transformers config class, keyword arguments): the shapes of the named models
SIZES = {
    "110M": ("BertConfig", {}),
    "355M": ("GPT2Config", {"n_embd": 1024, "n_layer": 24, "n_head": 16}),
    "1.3B": ("OPTConfig", {"hidden_size": 2048, "num_hidden_layers": 24, "ffn_dim": 8192, "num_attention_heads": 32,
                           "word_embed_proj_dim": 2048}),
    "6.7B": ("OPTConfig", {"hidden_size": 4096, "num_hidden_layers": 32, "ffn_dim": 16384, "num_attention_heads": 32,
                           "word_embed_proj_dim": 4096}),
}


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


def _build(size: str, out: Path, dtype: str) -> None:
    """A random model of the size's shape, saved as safetensors shards (biases randomised)."""
    import torch
    import transformers

    name, kw = SIZES[size]
    config = getattr(transformers, name)(**kw)
    config._attn_implementation = "sdpa"
    cls = transformers.AutoModel.from_config
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = cls(config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            elif "norm" in pname or "ln" in pname.split(".")[-2:][0]:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(out), safe_serialization=True, max_shard_size="2GB")


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
    with torch.no_grad():
        _calls.run_model(model, inputs)  # warm up
        times = []
        for _ in range(FORWARDS):
            start = time.perf_counter()
            _calls.run_model(model, inputs)
            times.append(time.perf_counter() - start)
        forward = sorted(times)[len(times) // 2]  # the median: the machine is shared
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
    return {"model_bytes": model_bytes, "forward_s": forward, "strip_s": strip_s, "fold_s": fold_s,
            "peak_bytes": _peak_bytes(), "rss_before_bytes": base, "params": sum(p.numel() for p in model.parameters()),
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
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "keybias.surgery", str(folder), str(out), "--fold-value"],
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    import resource

    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    shutil.rmtree(out, ignore_errors=True)
    return {"seconds": seconds, "peak_bytes": peak, "exit": done.returncode,
            "error": done.stderr.strip().splitlines()[-1] if done.returncode else ""}


def _machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next((int(line.split()[1]) // 2**20 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), 0)
    return f"{cpu}, {os.cpu_count()} cores, {mem} GiB"


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] in ("build", "floor", "library"):
        what, folder = sys.argv[1], Path(sys.argv[2])
        if what == "build":
            _build(sys.argv[3], folder, sys.argv[4])
            print(json.dumps({}))
        else:
            print(json.dumps(_floor(folder) if what == "floor" else _library(folder)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["110M", "355M", "1.3B"], choices=list(SIZES))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "machine")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    rows, load_start = [], os.getloadavg()[0]
    for size in args.sizes:
        work = Path(tempfile.mkdtemp(dir=args.scratch, prefix=f"keybias-bench-{size}-"))
        try:
            folder = work / "in"
            _child(["build", str(folder), size, args.dtype])
            floor = _child(["floor", str(folder)])
            lib = _child(["library", str(folder)])
            cli = _cli(folder)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        gb = 1e9
        row = {"size": size, "dtype": args.dtype, "parameters": lib["params"], "model_gb": lib["model_bytes"] / gb,
               "forward_s": lib["forward_s"], "strip_s": lib["strip_s"], "fold_s": lib["fold_s"],
               "strip_forward_passes": lib["strip_s"] / lib["forward_s"],
               "library_peak_gb": lib["peak_bytes"] / gb, "library_peak_over_model": lib["peak_bytes"] / lib["model_bytes"],
               "floor_s": floor["seconds"], "floor_peak_gb": floor["peak_bytes"] / gb,
               "cli_s": cli["seconds"], "cli_over_floor": cli["seconds"] / floor["seconds"],
               "cli_peak_gb": cli["peak_bytes"] / gb, "cli_peak_over_model": cli["peak_bytes"] / lib["model_bytes"],
               "cli_exit": cli["exit"], "whole_model_holds": lib["whole_model_holds"]}
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
             "| size | dtype | model GB | forward s | strip s (forward passes) | fold s | library peak GB (x model) "
             "| read+write floor s | CLI s (x floor) | CLI peak GB (x model) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['size']} | {r['dtype']} | {r['model_gb']:.2f} | {r['forward_s']:.2f} | {r['strip_s']:.2f} "
                     f"({r['strip_forward_passes']:.1f}) | {r['fold_s']:.2f} | {r['library_peak_gb']:.2f} "
                     f"({r['library_peak_over_model']:.2f}) | {r['floor_s']:.2f} | {r['cli_s']:.1f} "
                     f"({r['cli_over_floor']:.1f}) | {r['cli_peak_gb']:.2f} ({r['cli_peak_over_model']:.2f}) |")
    for size, (dtype, _why) in NOT_RUN.items():
        if size not in args.sizes:
            lines.append(f"| {size} | {dtype} | not run | | | | | | | |")
    lines += ["", COLUMNS.format(forwards=FORWARDS)]
    lines += [f"\n{size} not run: {why}." for size, (_dtype, why) in NOT_RUN.items() if size not in args.sizes]
    (args.out / "surgery_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
