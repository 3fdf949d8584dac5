"""The GPU profile: the measurements of notebooks 02, 03 and 06 that depend on the device, run on
a CUDA GPU by one command, and saved as plain CSV files for the build to judge (notebook 09).

The paper's build runs on machines without a GPU, so it cannot redo these measurements; it
judges the recorded files instead, and says which GPU, PyTorch and commit made them. Each
section runs on its own, with its own deadline: a section that fails is recorded with its error
and the others still run, so one broken kernel never loses the rest.

Sections (each writes `<section>_*.csv` into the output folder):

- `invariance`: notebook 02's nn.MultiheadAttention and SDPA grids on the GPU in every dtype,
  with the held-out null and power calibration made on the GPU itself. The configurations run in
  a fixed shuffled order until the deadline, so a cut is a random subsample, never a missing option.
- `precision`: notebook 03's output-change and gradient sweeps, with the fused SDPA kernels
  (flash, memory-efficient) that only a GPU has.
- `cost`: notebook 06's interleaved timing (BERT-base and GPT-2-small blocks, S = 128 and 512,
  self and cross attention, inference and training) on the wall clock, and the kernels and
  bytes removing b_k takes out of a step, counted on the CPU as in notebook 06.
- `memory`: the bytes b_k's parameter, gradient and optimizer state really occupy on the GPU.

Run: ``python -m keybias.studies.gpu.measure --out DIR --commit SHA`` (``--quick`` for a
seconds-long check of every section, on any device).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy
import pandas as pd
import torch

from keybias.studies.config import StudyConfig
from keybias.studies.cost import judge as cost_judge
from keybias.studies.cost import measure as cost_measure
from keybias.studies.cost import memory, traffic
from keybias.studies.invariance import controls
from keybias.studies.invariance import measure as invariance_measure
from keybias.studies.params import Param
from keybias.studies.precision import judge as precision_judge
from keybias.studies.precision import measure as precision_measure

SECTIONS = ("cost", "memory", "precision", "invariance")

# notebook 09 judges a recorded folder; it measures nothing itself
PARAMETERS = {
    "recorded": Param(str, help="folder (relative to the repository) holding a GPU profile's files and run records"),
}


@dataclasses.dataclass(frozen=True)
class GpuConfig(StudyConfig):
    """Notebook 09's one setting: which recorded GPU profile it judges."""

    PARAMETERS = PARAMETERS
    STUDY = "09_gpu"
    recorded: str = "recorded/gpu-h200"


RECORDED_FILES = (
    "cost_model.csv", "cost_ratios.csv", "cost_saving_bounds.csv", "cost_configs.csv", "memory_allocator.csv",
    "precision_errors.csv", "precision_errors_calibration.csv", "precision_gradients.csv",
    "precision_gradient_summary.csv", "invariance_configs.csv", "invariance_magnitudes.csv",
    "invariance_null_factor.csv", "invariance_unpowered.csv", "invariance_errors.csv",
)


def repository_root() -> Path:
    """The checkout this module runs from (src/keybias/studies/gpu/ sits four levels below it)."""
    return Path(__file__).resolve().parents[4]


def load_recorded(folder: Path) -> dict:
    """The recorded files of a GPU profile: {"runs": {file stem: run record}, "<file stem>": DataFrame}.

    The run records are the `run*.json` files (one per command; sections may be split over several
    runs, e.g. a section rerun after a fix). Raises FileNotFoundError naming every missing file and
    ValueError naming any section no run record covers, before anything is judged."""
    folder = Path(folder)
    missing = [n for n in RECORDED_FILES if not (folder / n).is_file()]
    runs = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("run*.json"))}
    if missing or not runs:
        raise FileNotFoundError(f"{folder}: recorded GPU files missing: {missing or ['run*.json']} "
                                "(make them on a CUDA machine with `make gpu`)")
    uncovered = [s for s in SECTIONS if not any(s in r["sections"] for r in runs.values())]
    if uncovered:
        raise ValueError(f"{folder}: no run record covers the sections {uncovered}")
    out = {"runs": runs}
    for name in RECORDED_FILES:
        out[name.removesuffix(".csv")] = pd.read_csv(folder / name)
    return out

# notebook 02's paper profile, restricted to the families whose kernels depend on the device
INVARIANCE = dict(
    families=["mha", "sdpa"], embed_dims=[4, 16], num_heads=[1, 2], seq_len=5, batch_size=2,
    options=["plain", "bias_false", "add_bias_kv", "add_zero_attn", "add_bias_kv_zero_attn", "kdim_vdim", "dropout"],
    modes=["train", "eval", "inference", "inference_no_fastpath"],
    masks=["none", "bool", "float", "causal", "is_causal", "is_causal_only", "key_padding", "fully_masked_row"],
    need_weights=[True, False], batch_first=[True, False], dtypes=["float64", "float32", "bfloat16", "float16"],
    sizes=["1:1:1:1:1"], size_dtypes=["float64"], variants=["softmax"], hf_models=["bert"], realistic=["4:1:2:2:1:plain"],
    realistic_dtypes=["float64"], seed=0, magnitudes=[0.01, 1.0, 100.0], calibration_cases=48,
)
# notebook 03's paper profile, with the fused kernels a GPU has
PRECISION = dict(dtypes=["float64", "float32", "bfloat16", "float16"],
                 paths=["explicit", "sdpa_math", "sdpa_flash", "sdpa_efficient", "mha"],
                 head_dim=32, num_heads=2, seq_len=64, batch=4, ratio_log10_min=-1.5, ratio_log10_max=3.0,
                 ratio_points=19, grad_batches=12, seed=0, calibration_seed=1)
# notebook 06's full grid (`make bench`), on the wall clock a GPU needs
COST = dict(blocks=["BERT-base", "GPT-2 small"], seq_lens=[128, 512], batch=8, attentions=["self", "cross"],
            passes=["inference", "training"], min_reps=30, max_reps=400, target_half_width=0.005, warmup=5,
            min_rep_seconds=0.0, optimizer="adam", n_boot=4000, seed=0, clock="wall", threads=1)
MEMORY_WIDTHS = [768, 1024, 4096]

QUICK = dict(
    invariance=dict(INVARIANCE, embed_dims=[4], num_heads=[1], options=["plain", "add_bias_kv"], modes=["eval"],
                    masks=["none", "causal"], need_weights=[False], batch_first=[True], dtypes=["float64", "float32"],
                    calibration_cases=4),
    precision=dict(PRECISION, dtypes=["float64", "float32"], paths=["explicit", "sdpa_efficient", "mha"], head_dim=8,
                   num_heads=1, seq_len=16, batch=2, ratio_points=4, grad_batches=3),
    cost=dict(COST, blocks=["tiny"], seq_lens=[16], batch=2, max_reps=30, target_half_width=0.0, n_boot=200, warmup=1),
    memory_widths=[64],
)
DEADLINES = {"cost": 120.0, "memory": 30.0, "precision": 90.0, "invariance": 180.0}


def _write_csv(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_suffix(".csv.tmp")
    frame.to_csv(tmp, index=False, float_format="%.9g")
    os.replace(tmp, path)


def machine_record(device: str, commit: str) -> dict:
    """Which machine, GPU, driver and software made the files (recorded, never judged)."""
    rec = {"commit": commit, "python": platform.python_version(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "device": device, "platform": platform.platform(),
           "cpu_count": os.cpu_count(), "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        rec["cpu_model"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo", encoding="utf-8")
                                if line.startswith("model name"))
    except (OSError, StopIteration):
        rec["cpu_model"] = platform.processor() or "unknown"
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        rec.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   gpu_capability=f"{props.major}.{props.minor}", gpu_multiprocessors=props.multi_processor_count,
                   cudnn=torch.backends.cudnn.version())
        try:
            rec["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True,
                timeout=30, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            rec["driver"] = "unknown"

    rec.update(pandas=pd.__version__, numpy=numpy.__version__)
    return rec


def run_invariance(out: Path, device: str, spec: dict, deadline: float) -> dict:
    cfg = invariance_measure.InvarianceConfig.from_mapping(spec)
    magnitudes = list(cfg.magnitudes)
    configs = [c for c in invariance_measure.build_configs(cfg, device=device) if c["device"] == device]
    t0 = time.perf_counter()
    null_factor, calibration = controls.calibrate_null_factor(configs, magnitudes, cases=cfg.calibration_cases)
    unpowered, power = controls.calibrate_power(configs, magnitudes, null_factor)
    calibration_seconds = time.perf_counter() - t0
    order = list(range(len(configs)))
    random.Random(cfg.seed).shuffle(order)  # a cut at the deadline is then a random subsample
    frames, mags, times, errors, done = [], [], [], [], 0
    stop = time.perf_counter() + max(0.0, deadline - calibration_seconds)
    while done < len(order) and time.perf_counter() < stop:
        one = configs[order[done]]
        try:  # one configuration at a time: an unforeseen failure costs that row, recorded, not the section
            rows, per_mag, secs = invariance_measure.run_sweep([one], magnitudes, null_factor=null_factor, unpowered=unpowered)
        except Exception as exc:  # noqa: BLE001 - kept as an `error` row with PyTorch's message
            errors.append({"config_id": done, "family": one["family"], "case": one["case"], "dtype": one["dtype"],
                           "error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"})
            done += 1
            continue
        for frame in (rows, per_mag, secs):  # each has a row per configuration, numbered by the sweep
            frame["config_id"] = done
        frames.append(rows)
        mags.append(per_mag)
        times.append(secs)
        done += 1
    _write_csv(pd.DataFrame(errors, columns=["config_id", "family", "case", "dtype", "error"]),
               out / "invariance_errors.csv")
    rows = pd.concat(frames, ignore_index=True)
    _write_csv(rows, out / "invariance_configs.csv")
    _write_csv(pd.concat(mags, ignore_index=True), out / "invariance_magnitudes.csv")
    _write_csv(pd.concat(times, ignore_index=True), out / "invariance_seconds.csv")
    _write_csv(calibration, out / "invariance_calibration.csv")
    _write_csv(power, out / "invariance_power_calibration.csv")
    factors = pd.DataFrame([{"dtype": d, "magnitude": m, "kappa": k} for d, by in null_factor.items()
                            for m, k in by.items()])
    _write_csv(factors, out / "invariance_null_factor.csv")
    _write_csv(pd.DataFrame(sorted(unpowered), columns=["group", "dtype", "magnitude"]), out / "invariance_unpowered.csv")
    return {"configs_planned": len(configs), "configs_run": done, "configs_failed": len(errors),
            "calibration_seconds": calibration_seconds}


def run_precision(out: Path, device: str, spec: dict) -> dict:
    sizes = dict(head_dim=spec["head_dim"], num_heads=spec["num_heads"], seq_len=spec["seq_len"],
                 batch=spec["batch"], device=device)
    ratios = precision_measure.bias_ratios(spec["ratio_log10_min"], spec["ratio_log10_max"], spec["ratio_points"])
    errors = precision_judge.add_floor(precision_measure.error_sweep(spec["dtypes"], spec["paths"], ratios=ratios, seed=spec["seed"], **sizes))
    calibration = precision_judge.add_floor(precision_measure.error_sweep(spec["dtypes"], spec["paths"], ratios=ratios,
                                                      seed=spec["calibration_seed"], **sizes))
    grads = precision_measure.gradient_sweep(spec["dtypes"], spec["paths"], batches=spec["grad_batches"], seed=spec["seed"], **sizes)
    _write_csv(errors, out / "precision_errors.csv")
    _write_csv(calibration, out / "precision_errors_calibration.csv")
    vectors = grads[["dtype", "path", "batch_index", "g_bq", "g_bk"]] if "batch_index" in grads else None
    _write_csv(grads.drop(columns=["g_bq", "g_bk"]), out / "precision_gradients.csv")
    if vectors is not None:
        vectors = vectors.assign(g_bq=vectors["g_bq"].map(json.dumps), g_bk=vectors["g_bk"].map(json.dumps))
        _write_csv(vectors, out / "precision_gradient_vectors.csv")
    _write_csv(precision_measure.gradient_summary(grads), out / "precision_gradient_summary.csv")
    return {"error_rows": len(errors), "gradient_rows": len(grads)}


def run_cost(out: Path, device: str, spec: dict, deadline: float) -> dict:
    spec = dict(spec)
    grid = {k: spec.pop(k) for k in ("blocks", "seq_lens", "batch", "attentions", "passes")}
    configs = cost_measure.block_configs(**grid)
    clock = cost_measure.clock_for(device, spec.pop("clock"))
    res = cost_measure.run_benchmark(configs, **spec, budget_seconds=deadline, device=device, clock=clock)
    bounds = traffic.saving_bounds(configs, spec["optimizer"], spec["seed"])
    model = cost_judge.predict_saving(res["ratios"], res["machine"], spec["optimizer"])
    _write_csv(res["raw"], out / "cost_raw.csv")
    _write_csv(res["medians"], out / "cost_medians.csv")
    _write_csv(res["ratios"], out / "cost_ratios.csv")
    _write_csv(res["configs"], out / "cost_configs.csv")
    _write_csv(bounds, out / "cost_saving_bounds.csv")
    _write_csv(model, out / "cost_model.csv")
    machine = {k: v for k, v in res["machine"].items() if k != "optimizer_param_step_s"}
    machine["optimizer_param_step_s"] = {str(k): v for k, v in res["machine"]["optimizer_param_step_s"].items()}
    (out / "cost_machine.json").write_text(json.dumps(machine, indent=2, default=str) + "\n", encoding="utf-8")
    return {"configs": len(configs), "clock": clock}


def run_memory(out: Path, device: str, widths) -> dict:
    rows = [memory.allocator_check(e, opt, device) for e in widths for opt in ("adam", "sgd_momentum")]
    _write_csv(pd.DataFrame(rows), out / "memory_allocator.csv")
    return {"rows": len(rows)}


def run(out: Path, *, device: str, commit: str, sections=SECTIONS, quick: bool = False) -> dict:
    """Run `sections` on `device` into `out`; returns (and writes to run.json) what each section did."""
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    record = {"machine": machine_record(device, commit), "quick": quick, "sections": {}}
    scale = 0.2 if quick else 1.0
    jobs = {
        "cost": lambda: run_cost(out, device, QUICK["cost"] if quick else COST, DEADLINES["cost"] * scale),
        "memory": lambda: run_memory(out, device, QUICK["memory_widths"] if quick else MEMORY_WIDTHS),
        "precision": lambda: run_precision(out, device, QUICK["precision"] if quick else PRECISION),
        "invariance": lambda: run_invariance(out, device, QUICK["invariance"] if quick else INVARIANCE,
                                             DEADLINES["invariance"] * scale),
    }
    for name in sections:
        t0 = time.perf_counter()
        try:
            detail = jobs[name]()
            entry = {"status": "measured", **detail}
        except Exception as exc:  # noqa: BLE001 - recorded and reported; the other sections still run
            # paths relative to the checkout: the record is committed and must not name this machine's folders
            trace = traceback.format_exc().replace(f"{repository_root()}/", "")
            entry = {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "traceback": trace}
        entry["seconds"] = time.perf_counter() - t0
        record["sections"][name] = entry
        print(f"{name}: {entry['status']} in {entry['seconds']:.0f} s" +
              (f" ({entry['error']})" if entry["status"] == "failed" else ""), file=sys.stderr, flush=True)
        tmp = out / "run.json.tmp"
        tmp.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, out / "run.json")
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keybias.studies.gpu.measure", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder (created)")
    parser.add_argument("--commit", required=True, help="the commit of the code that runs (recorded)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cuda (default), or cpu to check the command")
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks every section in seconds")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False on this machine")
    record = run(args.out, device=args.device, commit=args.commit, sections=args.sections, quick=args.quick)
    return 0 if all(s["status"] == "measured" for s in record["sections"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
