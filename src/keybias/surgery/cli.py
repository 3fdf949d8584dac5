"""python -m keybias.surgery IN_DIR OUT_DIR [--fold-value] [--dtype ...]

Loads a Hugging Face model directory offline from safetensors only (never a pickle), removes
every key bias (and with --fold-value folds every value bias), certifies each change on the
module's own function and the whole model on random inputs in float64, and writes a directory
that transformers' from_pretrained loads with the stock architecture: the removed biases are
stored as explicit zeros (storage='zeros'), since a missing tensor would be re-initialized by
from_pretrained. Every other file of IN_DIR (tokenizer, sentence-transformers modules) is
copied. The output appears only when everything succeeded (written to a temporary folder
next to OUT_DIR, then renamed); on any error nothing is left behind and the exit code is 2.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

DTYPES = ("float32", "float64", "bfloat16", "float16")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".h5", ".msgpack")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


class CliError(Exception):
    """A problem with the input that stops the tool before anything is written."""


def check_input(in_dir: Path, out_dir: Path) -> None:
    """Every way the arguments can be wrong, checked before any model is loaded."""
    if not in_dir.exists():
        raise CliError(f"input directory {in_dir} does not exist")
    if not in_dir.is_dir():
        raise CliError(f"input {in_dir} is not a directory")
    if not (in_dir / "config.json").is_file():
        raise CliError(f"{in_dir} has no config.json: not a Hugging Face model directory")
    safetensors = list(in_dir.glob("*.safetensors"))
    if not safetensors:
        pickles = sorted(p.name for p in in_dir.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise CliError(f"{in_dir} holds only pickle checkpoints ({', '.join(pickles)}); this tool loads "
                           "safetensors only, because unpickling runs arbitrary code. Convert them first.")
        raise CliError(f"{in_dir} has no *.safetensors weights")
    if out_dir.exists():
        raise CliError(f"output {out_dir} already exists; choose a new directory")
    if not out_dir.parent.is_dir():
        raise CliError(f"the parent of the output, {out_dir.parent}, does not exist")


def _architecture(in_dir: Path):
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(in_dir), local_files_only=True)
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return config, cls
    return config, transformers.AutoModel


def _probe_inputs(model, seed: int = 0) -> dict[str, Any]:
    """Random token ids with padding on the second example (never a fully masked row)."""
    import torch

    cfg = model.config
    vocab = getattr(cfg, "vocab_size", None)
    if not vocab:
        raise CliError(f"{type(model).__name__}: the whole-model check needs a token model (config.vocab_size)")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(min(5, vocab - 1), vocab, (2, 12), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, -4:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def whole_model_check(before, after) -> dict[str, float]:
    """Run float64 copies of the model before and after on random inputs; the change must stay
    below float32's unit roundoff times the output size (2^-24 max|y|): a float64 change
    below it cannot be seen in float32 (bound from the float32 format, fixed in advance)."""
    import torch

    from keybias import families

    a, b = copy.deepcopy(before).double().eval(), copy.deepcopy(after).double().eval()
    inputs = _probe_inputs(a)
    y0 = families.model_outputs(a, (), inputs)
    y1 = families.model_outputs(b, (), inputs)
    diff = (y1 - y0).abs()
    finite = bool(torch.isfinite(diff).all())
    change = float(diff.max()) if finite else float("inf")
    bound = 2.0**-24 * float(y0.abs().max())
    return {"change": change, "bound": bound, "holds": finite and change <= bound}


def require_transformers() -> None:
    """Hugging Face models need the optional dependency `transformers` (the `hf` extra)."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        raise CliError("Hugging Face model directories need the package transformers, which is not "
                       "installed: pip install 'keybias[hf]'")


def convert(in_dir: Path, out_dir: Path, *, fold_value: bool = False, dtype: str | None = None,
            log=print) -> dict[str, Any]:
    """The whole command: check, load, strip (and fold), certify, write atomically."""
    check_input(in_dir, out_dir)
    require_transformers()
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import torch
    import transformers

    from keybias import surgery

    transformers.utils.logging.disable_progress_bar()
    if dtype is not None and dtype not in DTYPES:
        raise CliError(f"--dtype {dtype!r} unknown; allowed: {list(DTYPES)}")
    config, cls = _architecture(in_dir)
    model = cls.from_pretrained(str(in_dir), local_files_only=True, use_safetensors=True).eval()
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
    log(f"loaded {type(model).__name__} ({config.model_type}) from {in_dir}: "
        f"{sum(p.numel() for p in model.parameters()):,} parameters, {next(model.parameters()).dtype}")
    original = copy.deepcopy(model)
    reports = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", surgery.FullyMaskedRowWarning)
            reports.append(surgery.strip_key_bias(model, storage="zeros"))
            if fold_value:
                # The output is for inference (eval mode), where dropout is off and rows sum to one.
                reports.append(surgery.fold_value_bias(model, storage="zeros", allow_dropout=True))
                log("note: the value fold is exact in eval mode; with attention dropout active (training "
                    "mode) dropped rows do not sum to one. A fully masked query row (every key masked) "
                    "outputs b_o + W_o b_v instead of b_o on PyTorch's SDPA path.")
    except surgery.SurgeryRefused as exc:
        raise CliError(str(exc)) from exc
    if not any(r["modules_changed"] for r in reports):
        unknown = reports[0]["not_handled"]
        detail = "; ".join(f"{u['module']} ({u['type']}): {u['reason']}" for u in unknown[:3])
        raise CliError(f"architecture {config.model_type!r}: no attention module this tool handles. {detail}")
    for report in reports:
        log(format_report(report))
    check = whole_model_check(original, model)
    log(f"whole model, float64, random tokens: max change {check['change']:.3g} "
        f"(bound 2^-24 max|y| = {check['bound']:.3g}): {'ok' if check['holds'] else 'FAILED'}")
    if not check["holds"]:
        raise CliError("the whole-model check failed; nothing written")

    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        for item in in_dir.iterdir():
            if item.name == "config.json" or item.suffix in WEIGHT_SUFFIXES or item.name.endswith(".index.json"):
                continue
            target = tmp / item.name
            shutil.copytree(item, target) if item.is_dir() else shutil.copy2(item, target)
        model.save_pretrained(str(tmp), safe_serialization=True)
        summary = {"input": str(in_dir), "operations": [r["operation"] for r in reports],
                   "whole_model_check": check, "reports": reports}
        (tmp / "keybias_surgery.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        reloaded = cls.from_pretrained(str(tmp), local_files_only=True, use_safetensors=True)
        saved = model.state_dict()
        for name, tensor in reloaded.state_dict().items():
            if name in saved and not torch.equal(tensor, saved[name]):
                raise CliError(f"reloading {tmp} gave a different {name}")
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"wrote {out_dir}")
    return summary


def format_report(report: dict[str, Any]) -> str:
    lines = [f"{report['operation']}:"]
    for m in report["modules"]:
        ratio = m["change_over_tolerance"]
        cert = "" if ratio is None else f"  certified change/tolerance {ratio:.2g}"
        what = ", ".join(m["parameters"]) or m["reason"]
        lines.append(f"  {m['module']:<40} {m['family']:<10} {m['action']:<9} {what}{cert}")
    for u in report["not_handled"]:
        lines.append(f"  not handled: {u['module']} ({u['type']}): {u['reason']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="keybias-surgery",
        description="Remove key biases (and fold value biases) of a Hugging Face model directory, certified.")
    parser.add_argument("in_dir", type=Path, help="Hugging Face model directory (config.json + *.safetensors)")
    parser.add_argument("out_dir", type=Path, help="new directory to write (must not exist)")
    parser.add_argument("--fold-value", action="store_true", help="also fold every value bias into the output bias")
    parser.add_argument("--dtype", choices=DTYPES, default=None, help="convert the weights to this dtype first")
    args = parser.parse_args(argv)
    try:
        convert(args.in_dir, args.out_dir, fold_value=args.fold_value, dtype=args.dtype)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
