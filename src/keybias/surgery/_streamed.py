"""The command line on a sharded checkpoint: each shard streamed once, one attention module at a time.

The model is built on the meta device from config.json (no memory for its weights) only to find
its attention modules, their tensors' names and shapes and the refusals that depend on the
architecture alone. Then the shards are streamed, one after the other, in a background thread:
each byte of the checkpoint is read once and written once. The tensors of the attention
modules the tools change are read into memory (and written from there); every other byte is
copied by the kernel without entering the process. As soon as a module's tensors have all been
read, and while the copy goes on:

1. its tensors are put into that module (every other module stays on the meta device);
2. strip_key_bias (and fold_value_bias) run on that module alone, on built inputs (random
   hidden states of the module's width, with one padded key): each change is certified in
   float64 on a copy of the module of its own, on those calls and on randomised ones, with the
   redundancy probe and its control (b_k, then b_v, perturbed: the output must not move; b_q
   perturbed: it must), and the module's output is then checked in the checkpoint's own dtype
   against that dtype's rounding bound, after the strip and again after the fold. The fold's
   float64 runs start from the strip's float64 copy with the strip applied (the same calls),
   so each module is converted to float64 once; the copy's bias slots are first compared with
   the stripped module's, so the fold is certified on exactly what a fresh copy would hold;
3. the changed tensors (a few bias vectors) are kept and the module goes back to the meta device.

When every shard is copied and every module certified, the changed tensors are written into the
copies at their offsets and each written shard is checked without a second full read: its size
and header equal the input's, every changed tensor reads back as certified, and every other
tensor's first and last bytes read back as the input's (see keybias.surgery._shards for what
that catches). Everything goes to a temporary folder that is renamed into place only when all of
it is done. The memory needed is a few attention modules (read ahead of the certification) and
one module's float64 copy, whatever the size of the model; the time is one read and one write
of the checkpoint, overlapped with the certification, which on a loaded CPU is the longer.

What it does not do: run the whole model. Each module is certified on its own; the identities
(softmax ignores a constant added to every score of a row; a row of weights that sums to one
passes b_v through unchanged) are exact for the module whatever feeds it, so the composed model
is exact too, and each module's rounding is bounded by its own check.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from keybias import surgery
from keybias.surgery import _shards
from keybias.surgery._core import Float64Buffers, run_surgery
from keybias.surgery._sites import discover
from keybias.surgery.cli import (
    TEMP_TAG,
    WEIGHT_SUFFIXES,
    CliError,
    _architecture,
    _commit,
    _dropout_refusal,
    _more,
    _names,
    _refuse_mismatch,
    _transformers,
    clip,
    fold_note,
    format_report,
    quiet_libraries,
    refusal_message,
)

BATCH, LENGTH = 2, 8  # built inputs: two sequences of eight positions, the second's last key padded
READ_AHEAD = 4  # modules' tensors the copier may hold before the certification takes them


def _meta_model(cls, config) -> nn.Module:
    transformers = _transformers()
    try:
        with torch.device("meta"), quiet_libraries():
            if cls is transformers.AutoModel:
                return transformers.AutoModel.from_config(config).eval()
            return cls(config).eval()
    # an AssertionError: torch's own checks of a module's arguments (a pad_token_id outside the vocabulary)
    except (RuntimeError, ValueError, TypeError, KeyError, AttributeError, AssertionError) as exc:
        raise CliError(f"transformers cannot build {cls.__name__} from config.json: {clip(str(exc))}") from exc


def _name_map(model: nn.Module, stored: set[str]) -> tuple[dict[str, str], dict[int, list[str]]]:
    """(checkpoint name -> model name, id of each model tensor -> all its names). Checkpoints
    saved from the base model lack the head's prefix (or have one the head does not): the
    mapping that matches most stored names is used, and any name it leaves is reported."""
    held: dict[int, list[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        held.setdefault(id(t), []).append(name)
    names = {n for group in held.values() for n in group}
    prefix = getattr(model, "base_model_prefix", "") or ""
    candidates = [lambda k: k]
    if prefix:
        candidates += [lambda k: f"{prefix}.{k}", lambda k: k.removeprefix(f"{prefix}.")]
    best = max(candidates, key=lambda f: sum(f(k) in names for k in stored))
    return {k: best(k) for k in stored}, held


def _check_tensors(in_dir: Path, what: str, model: nn.Module, weight_map: dict[str, str],
                   tables: dict[str, dict]) -> dict[str, str]:
    """The checkpoint's tensors against the architecture's: missing, unexpected or mis-shaped
    ones are an error naming them. Returns model name -> checkpoint name."""
    to_model, held = _name_map(model, set(weight_map))
    state = model.state_dict(keep_vars=True)
    covered = {id(state[m]) for m in to_model.values() if m in state}
    missing = [group[0] for tid, group in held.items() if tid not in covered]
    unexpected = [k for k, m in to_model.items() if m not in state]
    mismatched = []
    for key, name in to_model.items():
        if name in state:
            shape = tuple(tables[weight_map[key]][key]["shape"])
            if shape != tuple(state[name].shape):
                mismatched.append((key, shape, tuple(state[name].shape)))
    _refuse_mismatch(in_dir, what, {"missing_keys": missing, "unexpected_keys": unexpected,
                                    "mismatched_keys": mismatched})
    return {m: k for k, m in to_model.items()}


def _unit_inputs(unit: nn.Module, site, dtype: torch.dtype, seed: int) -> tuple[tuple, dict]:
    """Random hidden states of the unit's input width and an additive padding mask."""
    first = unit.get_submodule(site.projections[0])
    width = first.weight.shape[0 if site.layout == "packed" else 1]
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(BATCH, LENGTH, width, generator=gen).to(dtype)
    mask = torch.zeros(BATCH, 1, LENGTH, LENGTH, dtype=dtype)
    mask[1, :, :, -1] = torch.finfo(dtype).min  # one padded key, never a fully masked row
    return (hidden,), {"attention_mask": mask}


def _prefixed(entries: list[dict], unit_path: str, key: str = "module") -> list[dict]:
    out = []
    for e in entries:
        e = dict(e)
        inner = e.get(key, "")
        e[key] = unit_path if inner in ("", "<root>") else f"{unit_path}.{inner}"
        out.append(e)
    return out


def _merge(total: dict, part: dict, unit_path: str) -> None:
    total["modules"] += _prefixed(part["modules"], unit_path)
    total["modules_changed"] += [unit_path if m == "<root>" else f"{unit_path}.{m}" for m in part["modules_changed"]]
    total["parameters_removed"] += [f"{unit_path}.{p}" for p in part["parameters_removed"]]
    total["parameters_folded"] += [f"{unit_path}.{p.replace(' -> ', ' -> ' + unit_path + '.')}"
                                   for p in part["parameters_folded"]]
    total["unchanged"] += _prefixed(part["unchanged"], unit_path)
    total["not_handled"] += _prefixed(part["not_handled"], unit_path)
    check = part.get("whole_model")
    if check is not None:
        total["unit_checks"].append({"module": unit_path, **check})


def _empty(operation: str) -> dict[str, Any]:
    return {"operation": operation, "storage": "zeros", "modules": [], "modules_changed": [],
            "parameters_removed": [], "parameters_folded": [], "unchanged": [], "not_handled": [],
            "unit_checks": [], "refused": []}


def _shared_outside(unit_path: str, unit: nn.Module, held: dict[int, list[str]]) -> list[str]:
    """Names outside the unit of tensors the unit holds (tied weights): one module's change
    would change another module the tool does not look at."""
    prefix = f"{unit_path}."
    out = []
    for t in unit.state_dict(keep_vars=True).values():
        out += [n for n in held.get(id(t), []) if not n.startswith(prefix)]
    return out


def _itemsize(info: dict) -> int:
    dtype = _shards.DTYPES.get(info["dtype"])
    return torch.empty(0, dtype=dtype).element_size() if dtype is not None else 1


def _non_finite(unit: nn.Module, stored_names: dict[str, str]) -> list[tuple[str, str]]:
    """(stored name, "NaN" or "infinite values") of each floating tensor of the unit that is not finite."""
    out = []
    for k, t in unit.state_dict().items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            out.append((stored_names.get(k, k), "NaN" if bool(torch.isnan(t).any()) else "infinite values"))
    return out


def _certify_unit(model: nn.Module, unit_path: str, index: int, sites: list, loaded: dict[str, torch.Tensor],
                  stored_names: dict[str, str], operations: list[str], allow_dropout: bool, reports: dict,
                  replacements: dict[str, torch.Tensor], buffers: Float64Buffers) -> None:
    """Put one module's tensors in it, strip (and fold) it on built inputs, keep the changed
    tensors, and send the module back to the meta device. The fold starts from the strip's
    float64 copy of the module (the same calls, the strip applied): one conversion to float64
    per module, certified as a fresh copy would be."""
    unit = model.get_submodule(unit_path) if unit_path else model
    unit.load_state_dict(loaded, assign=True, strict=True)
    absent = [n for n, t in list(unit.named_parameters()) + list(unit.named_buffers()) if t.is_meta]
    if absent:
        raise CliError(f"{unit_path} has tensors that the checkpoint does not store ({_names(absent)}); the "
                       "sharded mode cannot rebuild them; nothing written")
    site = next(s for s in sites if s.unit_path == unit_path)
    bad = _non_finite(unit, stored_names)
    if bad:
        # Left as it is (the other tensors of the checkpoint are copied unread, so the module's
        # NaN is no reason to refuse the rest); said plainly, since its probes would only report
        # an output that nothing moves, which reads as if the module had no effect.
        reason = (f"not certified: its weights hold {bad[0][1]} (tensor {bad[0][0]}{_more([b for b, _ in bad[1:]], 0)}),"
                  " so no change to it can be checked; its biases were left as they are")
        for op in operations:
            reports[op]["not_handled"] += [{"module": s.name, "type": s.module_type or s.family, "reason": reason}
                                           for s in sites if s.unit_path == unit_path]
        unit.to("meta")
        return
    dtype = next((t.dtype for t in loaded.values() if t.is_floating_point()), torch.float32)
    inputs = _unit_inputs(unit, site, dtype, seed=index)
    before = {k: t.clone() for k, t in unit.state_dict().items() if t.ndim <= 1}
    reuse: dict = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", surgery.FullyMaskedRowWarning)
            for op in operations:  # as strip_key_bias and fold_value_bias, with the float64 copy shared
                part = run_surgery(unit, op, storage="zeros", inputs=inputs, reuse=reuse, allow_dropout=allow_dropout,
                                   buffers=buffers)
                _merge(reports[op], part, unit_path)
    except surgery.SurgeryRefused as exc:
        raise CliError(refusal_message(exc, prefix=unit_path)) from exc
    for k, t in unit.state_dict().items():
        if k in before and not torch.equal(before[k], t):
            replacements[stored_names[k]] = t.detach().clone()
    unit.to("meta")


def convert_sharded(in_dir: Path, out_dir: Path, *, fold_value: bool, allow_dropout: bool, log) -> dict[str, Any]:
    """The command on a sharded checkpoint: check, plan on the meta device, certify and change
    one module at a time while the shards are copied, then put the changed tensors in their
    places and check the written shards, atomically."""
    try:
        weight_map, tables = _shards.read_index(in_dir)
    except _shards.CheckpointError as exc:
        raise CliError(str(exc)) from exc
    config, cls = _architecture(in_dir)
    model = _meta_model(cls, config)
    label = config.model_type
    to_stored = _check_tensors(in_dir, cls.__name__, model, weight_map, tables)
    held: dict[int, list[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        held.setdefault(id(t), []).append(name)
    n_params = sum(int(torch.Size(info["shape"]).numel()) for table in tables.values() for info in table.values())
    dtypes = sorted({info["dtype"] for table in tables.values() for info in table.values()})
    log(f"planned {type(model).__name__} ({label}) from {in_dir}: {n_params:,} stored entries in "
        f"{len(tables)} shards, {'/'.join(dtypes)}; processed one module at a time")

    sites, not_handled = discover(model)
    if fold_value and not allow_dropout:
        dropping = [s for s in sites if s.value is not None and s.dropout > 0 and not s.refuse_fold]
        if dropping:
            raise _dropout_refusal([s.name for s in dropping], dropping[0].dropout)
    operations = ["strip_key_bias"] + (["fold_value_bias"] if fold_value else [])
    reports = {op: _empty(op) for op in operations}
    for op in operations:
        reports[op]["not_handled"] += not_handled
    replacements: dict[str, torch.Tensor] = {}
    units = list(dict.fromkeys(s.unit_path for s in sites))
    # the stored names of each module's tensors, and the module that reads each stored name
    names_of: dict[str, dict[str, str]] = {}
    reader_of: dict[str, str] = {}
    for unit_path in units:
        unit = model.get_submodule(unit_path) if unit_path else model
        shared = _shared_outside(unit_path, unit, held)
        if shared:
            raise CliError(f"{unit_path} shares tensors with {_names(shared)}: the sharded mode changes one module "
                           "at a time and cannot change a tied tensor; nothing written")
        names_of[unit_path] = {k: to_stored[f"{unit_path}.{k}" if unit_path else k]
                               for k in unit.state_dict(keep_vars=True)}
        for stored in names_of[unit_path].values():
            reader_of[stored] = unit_path
    wanted: dict[str, set[str]] = {}
    for stored in reader_of:
        wanted.setdefault(weight_map[stored], set()).add(stored)
    # tensors read ahead of the certification: a few modules' worth
    unit_bytes = max((sum(int(torch.Size(tables[weight_map[n]][n]["shape"]).numel()) * _itemsize(tables[weight_map[n]][n])
                          for n in names.values()) for names in names_of.values()), default=0)

    tmp = out_dir.parent / f".{out_dir.name}{TEMP_TAG}{os.getpid()}"
    tmp.mkdir()
    streamer = None
    # One thread fewer for torch while the shards are copied beside it: the copier (reads, kernel
    # copies, writes) gets a core, and the certification's float64 work on 2 x 8 tokens gains
    # little from a second thread (on a loaded 2-core machine, one thread certified a module of
    # OPT-6.7B's shape in half the time two took).
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads - 1))
    try:
        for item in in_dir.iterdir():
            if item.suffix in WEIGHT_SUFFIXES:
                continue
            target = tmp / item.name
            shutil.copytree(item, target) if item.is_dir() else shutil.copy2(item, target)
        streamer = _shards.Streamer(in_dir, tmp, list(tables), wanted, READ_AHEAD * unit_bytes)
        got: dict[str, torch.Tensor] = {}
        buffers = Float64Buffers()  # each module's float64 copy is converted into the last one's storage
        left = {u: set(n.values()) for u, n in names_of.items()}
        while left:
            item = streamer.tensors.get()
            if item is None:
                break
            stored, tensor = item
            got[stored] = tensor
            unit_path = reader_of[stored]
            left[unit_path].discard(stored)
            if left[unit_path]:
                continue
            del left[unit_path]
            loaded = {k: got.pop(n) for k, n in names_of[unit_path].items()}
            _certify_unit(model, unit_path, units.index(unit_path), sites, loaded, names_of[unit_path], operations,
                          allow_dropout, reports, replacements, buffers)
            streamer.release(list(loaded.values()))
            del loaded
        streamer.finish()
        if left:
            raise CliError(f"the shards ended before every tensor of {_names(left)} was read; nothing written")
        for shard in tables:
            mine = {k: v for k, v in replacements.items() if weight_map[k] == shard}
            _shards.patch(in_dir / shard, tmp / shard, mine)
            _shards.check_written(in_dir / shard, tmp / shard, mine)

        strip = reports["strip_key_bias"]
        if not any(r["modules_changed"] for r in reports.values()):
            if strip["unchanged"] and not strip["not_handled"]:
                raise CliError(f"architecture {label!r}: no key bias to remove ({strip['unchanged'][0]['reason']}); "
                               "nothing written")
            detail = "; ".join(f"{u['module']} ({u['type']}): {u['reason']}" for u in strip["not_handled"][:3]) + _more(strip["not_handled"])
            raise CliError(f"architecture {label!r}: no attention module this tool handles. {detail}")
        for op in operations:
            log(format_report(reports[op]))
        if fold_value:
            log(fold_note(allow_dropout))
        checks = [c for r in reports.values() for c in r["unit_checks"]]
        check = {"mode": "per module", "modules": len(checks), "holds": all(c["holds"] for c in checks),
                 "dtype": checks[0]["dtype"] if checks else "",
                 "largest_change_over_bound": max((c["change"] / c["bound"] if c["bound"] > 0 else float("inf"))
                                                  for c in checks) if checks else None}
        worst = max((m["change_over_tolerance"] for r in reports.values() for m in r["modules"]
                     if m["change_over_tolerance"] is not None), default=0.0)
        log(f"each changed module certified on its own, float64 (largest change/tolerance {worst:.2g}) and "
            f"{check['dtype']} (largest change/rounding bound {check['largest_change_over_bound']:.2g}): "
            f"{'ok' if check['holds'] else 'FAILED'}")
        if not check["holds"]:
            raise CliError("a module's own check failed; nothing written")

        summary = {"input": str(in_dir), "operations": operations, "sharded": True,
                   "certification": check, "reports": list(reports.values()),
                   "tensors_changed": sorted(replacements)}
        (tmp / "keybias_surgery.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        _commit(tmp, out_dir, log)
    except _shards.CheckpointError as exc:
        if streamer is not None:
            streamer.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        raise CliError(str(exc)) from exc
    except BaseException:
        if streamer is not None:
            streamer.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        torch.set_num_threads(threads)
    return summary
