"""python -m keybias.surgery IN_DIR OUT_DIR [--fold-value [--allow-dropout]] [--dtype ...]

Removes every key bias of a model folder (and with --fold-value folds every value bias),
certifies each change and writes a new folder, offline and from safetensors only (never a
pickle). IN_DIR is a Hugging Face model directory, timm's Hugging Face folder or open_clip's.

One file (model.safetensors): the model is loaded whole, each change is certified on a float64
copy of its module alone (on the calls the model makes on built inputs) and the whole model is
checked in its own dtype against that dtype's rounding bound.

Sharded (model.safetensors.index.json and its shards, a Hugging Face directory): the checkpoint
is never loaded whole. The model is built on the meta device to find its attention modules;
the shards are streamed once (each byte read once and written once: the changed modules'
tensors through memory, the rest copied by the kernel), and each module the tools change is
certified as soon as its tensors are read, on its own in float64 (built inputs: random hidden
states with a padded key, and randomised ones; the redundancy probe and its control) and checked
in the checkpoint's dtype. The changed bias vectors are then written in their places, and each
written shard is checked by its size, its header, the changed tensors read back and the first
and last bytes of every other tensor (not by a second full read). Memory: a few attention
modules and one float64 copy; time: one read and one write of the checkpoint, overlapped with
the certification. The identities are exact for
each module whatever feeds it (softmax ignores a constant added to every score of a row; a row
of weights that sums to one passes b_v through), so certifying each module on its own certifies
the composition; no forward pass of the whole model is run in this mode.

The output loads with the stock architecture (from_pretrained, timm, open_clip): removed biases
are stored as explicit zeros, since a missing tensor would be re-initialized. Every other file
of IN_DIR (tokenizer, sentence-transformers modules, the index) is copied.

Never a guess: a checkpoint with a tensor missing (transformers would initialise it at random),
an unexpected tensor (it would be dropped), a shape that differs from config.json, a shard the
index names but the folder lacks, or an index that places a tensor in a shard that does not hold
it, is an error naming them, before any surgery. --fold-value on a model with attention dropout
configured is refused unless --allow-dropout says that the output is for inference (the fold is
exact in eval mode; in training mode dropped rows do not sum to one): from the config file's keys,
before the model is loaded, and otherwise naming the modules the built model shows it in.

Atomic: the output is written to a temporary folder next to OUT_DIR and renamed into place only
when complete and checked (one file: read back tensor by tensor; sharded: as above); on any error or Ctrl-C before that, nothing is
left and the exit code is 2 (a rerun removes a killed run's temporary folder). A run holds a lock
on .OUT_DIR.keybias-lock beside OUT_DIR: a second run for the same OUT_DIR is refused while the
first lives, and the kernel frees the lock when a run dies, so a dead run never blocks a rerun. Once OUT_DIR is
complete the run has succeeded: an interrupt after that exits 0. Another library's long error
message is cut with "…"; KEYBIAS_FULL_ERRORS=1 shows it whole.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import sys
import threading
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from keybias import surgery
from keybias.surgery import _calls
from keybias.surgery._sites import discover

DTYPES = ("float32", "float64", "bfloat16", "float16")
INDEX = "model.safetensors.index.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".h5", ".msgpack")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


class CliError(Exception):
    """A problem with the input that stops the tool before anything is written."""


TEMP_TAG = ".keybias-tmp-"
LOCK_TAG = ".keybias-lock"
CLIP = 300  # characters of another library's message shown in the one-line error
FULL_MESSAGES = "KEYBIAS_FULL_ERRORS"  # set to 1 to see every message whole


def clip(text: str, limit: int = CLIP) -> str:
    """Another library's message on one line; a long one is cut visibly, and the environment
    variable KEYBIAS_FULL_ERRORS=1 shows it whole."""
    text = " ".join(str(text).split())
    if len(text) <= limit or os.environ.get(FULL_MESSAGES) == "1":
        return text
    return text[:limit].rstrip() + f"… (cut; {FULL_MESSAGES}=1 shows it whole)"


def refusal_message(exc, prefix: str = "") -> str:
    """One line for a SurgeryRefused: the first refused module and its whole reason."""
    first, more = exc.refusals[0], len(exc.refusals) - 1
    module = first["module"]
    if prefix:
        module = prefix if module == "<root>" else f"{prefix}.{module}"
    tail = f" (and {more} more module{'s' if more > 1 else ''})" if more else ""
    return (f"{exc.report['operation']} refused, model unchanged: {module} ({first['family']}): "
            f"{first['reason']}{tail}")


def _check_safetensors(path: Path) -> dict[str, dict]:
    """The header of a safetensors file: 8 bytes of length, a JSON table whose tensors all lie
    inside the file (a truncated or empty file fails here, before anything is loaded). Returns
    that table without __metadata__: tensor name -> dtype, shape and offsets."""
    size = path.stat().st_size
    if size < 8:
        raise CliError(f"{path} is empty or truncated ({size} bytes): not a safetensors file")
    with path.open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n <= 0 or 8 + n > size:
            raise CliError(f"{path} is truncated or corrupt: its header claims {n} bytes, the file has {size}")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CliError(f"{path} has a corrupt header ({exc.__class__.__name__}): not a safetensors file") from exc
    if not isinstance(header, dict):
        raise CliError(f"{path} has a corrupt header: not a table of tensors")
    for name, info in header.items():
        if name != "__metadata__" and not (isinstance(info, dict) and {"dtype", "shape", "data_offsets"} <= set(info)):
            raise CliError(f"{path} has a corrupt header: its entry for {name} is not a tensor's "
                           "(dtype, shape and data_offsets)")
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise CliError(f"{path} is truncated: its tensors need {8 + n + end} bytes, the file has {size}")
    return {k: v for k, v in header.items() if k != "__metadata__"}


def lock_path(out_dir: Path) -> Path:
    return out_dir.parent / f".{out_dir.name}{LOCK_TAG}"


@contextlib.contextmanager
def run_lock(out_dir: Path):
    """Held for the whole run: an exclusive flock on a lock file beside OUT_DIR. The kernel frees
    it when the process dies, however it dies (a zombie holds no files), so a dead run never
    blocks a rerun and a live one always does, whatever its process id has become."""
    path = lock_path(out_dir)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            who = f" (process {holder})" if holder.isdigit() else ""
            raise CliError(f"another run{who} is writing {out_dir} (it holds {path}); wait for it to end") from None
        except OSError as exc:
            os.close(fd)
            raise CliError(f"cannot lock {path} ({exc.strerror}): the file system of the output does not "
                           "support file locks") from exc
        # the run that held the lock removes its file before releasing it: a lock on a file that is
        # no longer the one at that path guards nothing, so take the one in place
        try:
            held, here = os.fstat(fd), os.stat(path)
            if (held.st_dev, held.st_ino) == (here.st_dev, here.st_ino):
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)  # only to name this run in another's message
        yield path
    finally:
        try:
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)


def clean_stale(out_dir: Path, log=print) -> None:
    """Temporary folders of earlier runs for the same OUT_DIR, removed. Called with the run's
    lock held: a run that still works holds the lock, so every such folder is a dead run's."""
    for stale in sorted(out_dir.parent.glob(f".{out_dir.name}{TEMP_TAG}*")):
        shutil.rmtree(stale, ignore_errors=True)
        log(f"removed {stale}, the temporary folder of an interrupted earlier run")


def check_input(in_dir: Path, out_dir: Path) -> tuple[str, dict[str, dict]]:
    """Every way the arguments can be wrong, checked before any model is loaded: the input
    first, as the argument a user mistypes most, then the output's parent, so that no work is done
    for a result that could not be written. Returns the folder's format and the header table of
    each of its safetensors files (by file name)."""
    if not in_dir.exists():
        raise CliError(f"input directory {in_dir} does not exist")
    if not in_dir.is_dir():
        raise CliError(f"input {in_dir} is not a directory")
    if out_dir.absolute().resolve() == in_dir.absolute().resolve():
        raise CliError(f"output {out_dir} is the input directory; choose a new directory for the output")
    parent = out_dir.absolute().parent
    if parent.exists() and not parent.is_dir():
        raise CliError(f"the parent of the output, {parent}, is not a directory")
    if not parent.is_dir():
        raise CliError(f"the parent of the output, {parent}, does not exist")
    probe = parent / f".{out_dir.name}{TEMP_TAG}probe-{os.getpid()}"
    try:
        probe.mkdir()
        with contextlib.suppress(FileNotFoundError):  # a run beside this one cleaned it up
            probe.rmdir()
    except OSError as exc:
        raise CliError(f"the parent of the output, {parent}, is not writable ({exc.strerror})") from exc
    if out_dir.is_symlink():
        target = os.readlink(out_dir)
        state = "a dangling symbolic link" if not out_dir.exists() else "a symbolic link"
        raise CliError(f"output {out_dir} is {state} (to {target}); choose a new directory")
    if out_dir.exists():
        raise CliError(f"output '{out_dir}' already exists; choose a new directory")
    if out_dir.absolute().resolve().is_relative_to(in_dir.resolve()):
        raise CliError(f"output {out_dir} lies inside the input {in_dir}; choose a directory outside it")
    fmt = _format(in_dir)
    safetensors = sorted(in_dir.glob("*.safetensors"))
    if fmt == "open_clip" and safetensors:
        safetensors = [open_clip_weights(in_dir)[0]]
    if not safetensors:
        pickles = sorted(p.name for p in in_dir.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise CliError(f"{in_dir} holds only pickle checkpoints ({', '.join(pickles)}); this tool loads "
                           "safetensors only, because unpickling runs arbitrary code. Convert them first.")
        raise CliError(f"{in_dir} has no *.safetensors weights")
    return fmt, {path.name: _check_safetensors(path) for path in safetensors}


# open_clip 3.3.0's choice among a folder's checkpoints (open_clip.factory._find_checkpoint_in_dir):
# these names in this order, else the first by name with safetensors files first. Laion's Hub
# folders also hold transformers' model.safetensors, whose tensor names open_clip never reads.
OPEN_CLIP_PREFERRED = ("open_clip_model.safetensors", "open_clip_pytorch_model.safetensors",
                       "open_clip_pytorch_model.bin", "open_clip_pytorch_model.pth",
                       "model.safetensors", "pytorch_model.bin", "pytorch_model.pth", "model.pth")


def open_clip_weights(in_dir: Path) -> tuple[Path, list[str]]:
    """The checkpoint file open_clip itself loads from the folder, and the names of the other
    checkpoint files, which it (and so this tool) leaves unread. A pickle as open_clip's choice
    is an error: this tool reads safetensors only."""
    found = sorted(p for p in in_dir.iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin", ".pth"))
    found.sort(key=lambda p: p.suffix != ".safetensors")
    preferred = sorted((p for p in found if p.name in OPEN_CLIP_PREFERRED), key=lambda p: OPEN_CLIP_PREFERRED.index(p.name))
    chosen = (preferred or found)[0]
    if chosen.suffix != ".safetensors":
        raise CliError(f"open_clip would load {chosen.name} from {in_dir}, a pickle checkpoint; this tool loads "
                       "safetensors only, because unpickling runs arbitrary code. Convert it first.")
    return chosen, [p.name for p in found if p != chosen]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CliError(f"{path} is not valid JSON ({exc})") from exc


def _format(in_dir: Path) -> str:
    """'hf' (config.json with model_type), 'timm' (timm's Hugging Face folder: config.json with
    architecture) or 'open_clip' (open_clip_config.json with model_cfg)."""
    open_clip_config = in_dir / "open_clip_config.json"
    if open_clip_config.is_file():
        parsed = _read_json(open_clip_config)
        if not isinstance(parsed, dict) or not isinstance(parsed.get("model_cfg"), dict):
            raise CliError(f"{open_clip_config} has no model_cfg: not an open_clip config")
        return "open_clip"
    config = in_dir / "config.json"
    if not config.is_file():
        raise CliError(f"{in_dir} has no config.json: not a Hugging Face model directory "
                       "(nor timm's, nor open_clip's open_clip_config.json)")
    parsed = _read_json(config)
    if isinstance(parsed, dict) and isinstance(parsed.get("architecture"), str) and "model_type" not in parsed:
        return "timm"
    if not isinstance(parsed, dict) or not isinstance(parsed.get("model_type"), str):
        raise CliError(f"{config} has no model_type: not a transformers config")
    return "hf"


@contextlib.contextmanager
def quiet_libraries():
    """Other libraries' log messages (transformers' token-id warnings, timm's, open_clip's) and
    Python warnings, silenced while a model's config is read and the model is built and loaded:
    every problem they could report ends the run with the tool's own one line, and theirs would
    come before it. Errors that a library only logs still print."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def _architecture(in_dir: Path):
    with quiet_libraries():
        return _read_architecture(in_dir)


def _transformers():
    """transformers, imported on first use: `import keybias.surgery` and `keybias-surgery --help`
    must not load it, and convert() sets HF_HUB_OFFLINE before its first use."""
    import transformers

    return transformers


def _read_architecture(in_dir: Path):
    transformers = _transformers()
    try:
        config = transformers.AutoConfig.from_pretrained(str(in_dir), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise CliError(f"transformers cannot read {in_dir / 'config.json'}: {clip(exc)}") from exc
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return config, cls
    return config, transformers.AutoModel


def _names(keys, limit: int = 4) -> str:
    keys = sorted(keys)
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def load_exactly(cls, in_dir: Path):
    """The model exactly as stored, or a CliError: transformers fills a missing tensor with a
    random initialisation and drops an unexpected one, only warning; here either is an error
    that names them, and so is a tensor whose shape differs from the config's (one line)."""
    transformers = _transformers()
    verbosity = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.set_verbosity_error()  # the loading report is ours to give, in one line
    try:
        with quiet_libraries():
            model, info = cls.from_pretrained(str(in_dir), local_files_only=True, use_safetensors=True,
                                              output_loading_info=True, ignore_mismatched_sizes=True)
    # an AssertionError: torch's own checks of a module's arguments (a pad_token_id outside the vocabulary)
    except (OSError, ValueError, RuntimeError, KeyError, AssertionError) as exc:
        raise CliError(f"transformers could not load {in_dir} as {cls.__name__}: {clip(exc)}") \
            from exc
    finally:
        transformers.utils.logging.set_verbosity(verbosity)
    _refuse_mismatch(in_dir, cls.__name__, info)
    return model.eval()


def _refuse_mismatch(in_dir: Path, what: str, info: dict) -> None:
    """One line naming every way the checkpoint's tensors differ from what the architecture needs."""
    problems = []
    if info.get("missing_keys"):
        keys = info["missing_keys"]
        problems.append(f"{len(keys)} tensor{'s' if len(keys) > 1 else ''} missing from the checkpoint "
                        f"({_names(keys)}; transformers would fill them with random values)")
    if info.get("unexpected_keys"):
        keys = info["unexpected_keys"]
        problems.append(f"{len(keys)} unexpected tensor{'s' if len(keys) > 1 else ''} that the architecture "
                        f"does not use ({_names(keys)}; they would be dropped from the output)")
    if info.get("mismatched_keys"):
        rows = sorted(info["mismatched_keys"], key=lambda r: r[0])
        name, stored, wanted = rows[0]
        more = f" and {len(rows) - 1} more" if len(rows) > 1 else ""
        problems.append(f"shape mismatch: {name} is {tuple(stored)} in the checkpoint but {tuple(wanted)} in "
                        f"config.json{more}")
    if info.get("error_msgs"):
        problems.append(clip(" ".join(info["error_msgs"])))
    if problems:
        raise CliError(f"{in_dir} does not match its config as {what}: {'; '.join(problems)}; "
                       "nothing written")


def _refuse_dtypes(in_dir: Path, tables: dict[str, dict], model=None) -> None:
    """The output must hold each tensor in the dtype it was stored in, read from the headers
    check_input read (tables). A sharded checkpoint (model None) is rewritten tensor by tensor in
    its own dtype and each module is checked against that dtype's rounding bound: one that mixes
    float dtypes has no one bound. A single file is loaded into a model built in one dtype
    (without --dtype): one that mixes dtypes, or stores a weight as an integer, would come back
    converted."""
    stored = {name: info["dtype"] for table in tables.values() for name, info in table.items()}
    if model is None:
        floats = {}
        for name, kind in stored.items():
            if kind in ("F16", "BF16", "F32", "F64"):
                floats.setdefault(kind, name)
        if len(floats) > 1:
            kinds = ", ".join(f"{k} ({n})" for k, n in sorted(floats.items()))
            raise CliError(f"{in_dir} stores its float tensors as {kinds}: a sharded checkpoint must hold one "
                           "float dtype (convert it first); nothing written")
        return
    state = model.state_dict()
    changed = sorted(n for n, d in stored.items()
                     if n in state and _SAFETENSORS_DTYPES.get(d) != str(state[n].dtype).removeprefix("torch."))
    kinds = sorted({d for n, d in stored.items() if n in state})
    if changed:
        first = changed[0]
        raise CliError(f"{in_dir} stores its tensors as {', '.join(kinds)}, but the model holds them as "
                       f"{str(state[first].dtype).removeprefix('torch.')} ({first} is {stored[first]}"
                       f"{_more(changed[1:], 0)}): the output would change their dtype; pass --dtype to choose "
                       "one; nothing written")


def _refuse_non_finite(model) -> None:
    """A change cannot be certified against a NaN or an infinity: rounding bounds are then NaN."""
    bad = [n for n, t in model.state_dict().items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise CliError(f"tensor {bad[0]}{_more(bad[1:], 0)} holds NaN or infinite values; the tool cannot "
                       "certify a change to such a model; nothing written")


def _import_library(name: str, extra: str):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise CliError(f"this folder needs the package {name}, which is not installed: pip install "
                       f"'keybias[{extra}]'") from exc
    except RuntimeError as exc:  # torchvision's compiled ops do not match the installed torch
        raise CliError(f"{name} cannot be imported ({clip(exc)}): its torchvision does "
                       "not match the installed torch build; install a torchvision built for it") from exc


def load_library_folder(fmt: str, in_dir: Path):
    """A timm or open_clip model built from the folder's config and loaded with exactly the
    tensors of its safetensors files (missing, unexpected or mis-shaped ones are an error)."""
    with quiet_libraries():
        return _load_library_folder(fmt, in_dir)


def _load_library_folder(fmt: str, in_dir: Path):
    if fmt == "timm":
        timm = _import_library("timm", "timm")
        cfg = _read_json(in_dir / "config.json")
        kwargs = dict(cfg.get("model_args") or {})
        if "num_classes" in cfg:
            kwargs.setdefault("num_classes", cfg["num_classes"])
        try:
            model = timm.create_model(cfg["architecture"], pretrained=False, **kwargs)
        except (RuntimeError, ValueError, TypeError, KeyError, AssertionError) as exc:
            raise CliError(f"timm cannot build {cfg['architecture']!r}: {clip(exc)}") from exc
        label = f"timm {cfg['architecture']}"
    else:
        oc_model = _import_library("open_clip", "open_clip").model
        model_cfg = dict(_read_json(in_dir / "open_clip_config.json")["model_cfg"])
        custom = model_cfg.pop("custom_text", False) or "hf_model_name" in (model_cfg.get("text_cfg") or {})
        try:
            model = (oc_model.CustomTextCLIP if custom else oc_model.CLIP)(**model_cfg)
        except (RuntimeError, ValueError, TypeError, KeyError, AssertionError) as exc:
            raise CliError(f"open_clip cannot build the model of open_clip_config.json: "
                           f"{clip(exc)}") from exc
        label = "open_clip CLIP"
    state: dict = {}
    files = [open_clip_weights(in_dir)[0]] if fmt == "open_clip" else sorted(in_dir.glob("*.safetensors"))
    for path in files:
        state.update(load_file(str(path)))
    expected = model.state_dict()
    info = {"missing_keys": set(expected) - set(state), "unexpected_keys": set(state) - set(expected),
            "mismatched_keys": {(k, state[k].shape, expected[k].shape) for k in set(state) & set(expected)
                                if state[k].shape != expected[k].shape}}
    _refuse_mismatch(in_dir, label, info)
    with torch.no_grad():
        model.load_state_dict(state, strict=True)
    del state
    return model.eval(), label


def require_transformers() -> None:
    """Hugging Face models need the optional dependency `transformers` (the `hf` extra)."""

    if importlib.util.find_spec("transformers") is None:
        raise CliError("Hugging Face model directories need the package transformers, which is not "
                       "installed: pip install 'keybias[hf]'")


def _dropout_refusal(names: list[str], p: float, where: str = "") -> CliError:
    what = where or f"{_names(names)}, p={p}"
    return CliError(f"--fold-value refused: attention dropout is configured ({what}); in training "
                    "mode dropped rows do not sum to one, so the fold is exact only in eval mode; pass "
                    "--allow-dropout for an output used for inference; nothing written")


# The config keys under which Hugging Face (BERT-like, BART-like, GPT-2-like, MPT's attn_config,
# CLIP's sub-configs) and timm (model_args) set the dropout on the attention weights; an MLP's or
# a classifier's dropout (hidden_dropout_prob, drop_rate, ...) leaves the fold exact.
ATTENTION_DROPOUT_KEYS = ("attention_probs_dropout_prob", "attention_dropout", "attention_dropout_prob",
                          "attention_dropout_rate", "attention_probs_dropout", "attn_pdrop", "attn_dropout",
                          "attn_dropout_rate", "attn_drop_rate", "attn_drop")
CONFIG_FILES = {"hf": "config.json", "timm": "config.json", "open_clip": "open_clip_config.json"}


def configured_dropout(in_dir: Path, fmt: str) -> tuple[str, float] | None:
    """(where in the config file, p) of the first attention dropout above zero that the folder's
    config sets, read from the JSON alone (nothing is imported or built)."""
    found = []

    def walk(node, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                where = f"{path}.{key}" if path else str(key)
                if key in ATTENTION_DROPOUT_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
                    if value > 0:
                        found.append((where, float(value)))
                else:
                    walk(value, where)
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")

    name = CONFIG_FILES[fmt]
    walk(_read_json(in_dir / name), "")
    if not found:
        return None
    where, p = sorted(found)[0]
    return f"{name} {where}={p:g}", p


def _more(items: list, limit: int = 3) -> str:
    return f"; and {len(items) - limit} more" if len(items) > limit else ""


def convert(in_dir: Path, out_dir: Path, *, fold_value: bool = False, dtype: str | None = None,
            allow_dropout: bool = False, log=print) -> dict[str, Any]:
    """The whole command: check, load, strip (and fold), certify, write atomically. A sharded
    Hugging Face checkpoint (model.safetensors.index.json) is processed one module and one
    shard at a time (keybias.surgery._streamed), never loaded whole."""
    fmt, tables = check_input(in_dir, out_dir)
    if dtype is not None and dtype not in DTYPES:
        raise CliError(f"--dtype {dtype!r} unknown; allowed: {list(DTYPES)}")
    if fold_value and not allow_dropout:  # refused from the config, before seconds of loading
        dropout = configured_dropout(in_dir, fmt)
        if dropout is not None:
            raise _dropout_refusal([], dropout[1], where=dropout[0])
    sharded = (in_dir / INDEX).exists()
    if sharded and fmt != "hf":
        raise CliError(f"{in_dir / INDEX}: sharded checkpoints are read for Hugging Face model directories only "
                       f"(this one is {fmt}'s format)")
    if sharded:
        _refuse_dtypes(in_dir, tables)
    if sharded and dtype is not None:
        raise CliError("--dtype cannot be used with a sharded checkpoint, which is rewritten tensor by tensor "
                       "in its own dtype; convert it first")
    if fmt == "hf":
        require_transformers()
    with run_lock(out_dir):
        if out_dir.exists() or out_dir.is_symlink():  # a run that ended while this one checked its input
            raise CliError(f"output '{out_dir}' already exists; choose a new directory")
        clean_stale(out_dir, log)
        return _convert(in_dir, out_dir, fmt, sharded, tables, fold_value=fold_value, dtype=dtype,
                        allow_dropout=allow_dropout, log=log)


def _convert(in_dir: Path, out_dir: Path, fmt: str, sharded: bool, tables: dict[str, dict], *, fold_value: bool,
             dtype: str | None, allow_dropout: bool, log) -> dict[str, Any]:
    """convert() once the input is checked and this run holds OUT_DIR's lock."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    if sharded:
        from keybias.surgery._streamed import convert_sharded  # _streamed imports this module

        _transformers().utils.logging.disable_progress_bar()
        return convert_sharded(in_dir, out_dir, fold_value=fold_value, allow_dropout=allow_dropout, log=log)

    ignored: list[str] = []
    if fmt == "hf":
        _transformers().utils.logging.disable_progress_bar()
        config, cls = _architecture(in_dir)
        model = load_exactly(cls, in_dir)
        label = config.model_type
    else:
        model, label = load_library_folder(fmt, in_dir)
        cls = None
        if fmt == "open_clip":
            chosen, ignored = open_clip_weights(in_dir)
            if ignored:
                log(f"read {chosen.name}, the file open_clip loads from this folder; ignored {', '.join(ignored)} "
                    "(not read, and not in the output)")
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
    else:
        _refuse_dtypes(in_dir, tables, model)
    _refuse_non_finite(model)
    log(f"loaded {type(model).__name__} ({label}) from {in_dir}: "
        f"{sum(p.numel() for p in model.parameters()):,} parameters, {next(model.parameters()).dtype}")

    if _calls.example_inputs(model) is None:
        raise CliError(f"{type(model).__name__} ({label}): the tool builds inputs for models that take "
                       "token ids, pixel values, audio features or waveforms; this one takes "
                       f"{getattr(model, 'main_input_name', 'something else')!r}")
    if fold_value and not allow_dropout:
        dropping = [s for s in discover(model)[0] if s.value is not None and s.dropout > 0 and not s.refuse_fold]
        if dropping:
            raise _dropout_refusal([s.name for s in dropping], dropping[0].dropout)
    reports = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", surgery.FullyMaskedRowWarning)
            reports.append(surgery.strip_key_bias(model, storage="zeros"))
            if fold_value:
                reports.append(surgery.fold_value_bias(model, storage="zeros", allow_dropout=allow_dropout))
                log(fold_note(allow_dropout))
    except surgery.SurgeryRefused as exc:
        raise CliError(refusal_message(exc)) from exc
    if not any(r["modules_changed"] for r in reports) and reports[0]["unchanged"] and not reports[0]["not_handled"]:
        raise CliError(f"architecture {label!r}: no key bias to remove ("
                       f"{reports[0]['unchanged'][0]['reason']}); nothing written")
    if not any(r["modules_changed"] for r in reports):
        unknown = reports[0]["not_handled"]
        detail = "; ".join(f"{u['module']} ({u['type']}): {u['reason']}" for u in unknown[:3]) + _more(unknown)
        raise CliError(f"architecture {label!r}: no attention module this tool handles. {detail}")
    for report in reports:
        log(format_report(report))
    checks = [r.get("whole_model") for r in reports if r["modules_changed"]]
    if not checks or any(c is None for c in checks):
        raise CliError("the whole-model check could not run on the built inputs; nothing written")
    check = {"change": max(c["change"] for c in checks), "bound": min(c["bound"] for c in checks),
             "holds": all(c["holds"] for c in checks), "dtype": checks[0].get("dtype", ""), "per_operation": checks}
    log(f"whole model, {check['dtype']}, random inputs: max change {check['change']:.3g} "
        f"(rounding bound {check['bound']:.3g}): {'ok' if check['holds'] else 'FAILED'}")
    if not check["holds"]:
        raise CliError("the whole-model check failed; nothing written")

    tmp = out_dir.parent / f".{out_dir.name}{TEMP_TAG}{os.getpid()}"
    try:
        tmp.mkdir()
        for item in in_dir.iterdir():
            if ((fmt == "hf" and item.name == "config.json") or item.suffix in WEIGHT_SUFFIXES
                    or item.name.endswith(".index.json")):
                continue
            target = tmp / item.name
            shutil.copytree(item, target) if item.is_dir() else shutil.copy2(item, target)
        if fmt == "hf":
            model.save_pretrained(str(tmp), safe_serialization=True)
        else:
            name = "open_clip_model.safetensors" if fmt == "open_clip" else "model.safetensors"
            save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(tmp / name),
                      metadata={"format": "pt"})
        summary = {"input": str(in_dir), "operations": [r["operation"] for r in reports],
                   "whole_model_check": check, "reports": reports,
                   **({"ignored_files": ignored} if ignored else {})}
        (tmp / "keybias_surgery.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        verify_written(tmp, model.state_dict())
        _commit(tmp, out_dir, log)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                       "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def _read_tensors(path: Path):
    """(name, tensor) for every tensor of a safetensors file, read with plain reads one tensor
    at a time: a memory map would count every page of the file in the process's memory."""
    with path.open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            start, stop = (int(x) for x in info["data_offsets"])
            f.seek(8 + n + start)
            data = bytearray(f.read(stop - start))
            dtype = getattr(torch, _SAFETENSORS_DTYPES.get(info["dtype"], ""), None)
            if dtype is None:
                raise CliError(f"{path.name}: tensor {name} has dtype {info['dtype']}, which this check cannot read")
            flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
            yield name, flat.reshape(info["shape"])


def _fingerprint(t) -> tuple:
    flat = t.reshape(-1)
    head = tuple(flat[:4].double().tolist())
    return (tuple(t.shape), str(t.dtype), float(flat.double().sum()) if flat.numel() else 0.0, head)


def verify_written(folder: Path, state: dict) -> None:
    """Every tensor written equals one of the model's, read back one tensor at a time (no
    second copy of the model in memory). transformers may store a tensor under another name
    than the module path (its checkpoint conversion), so a name that is not a module path is
    matched by content: shape, dtype, sum and first entries, then compared exactly."""
    by_print: dict[tuple, list] = {}
    for tensor in state.values():
        by_print.setdefault(_fingerprint(tensor), []).append(tensor)
    seen = 0
    for path in sorted(folder.glob("*.safetensors")):
        for name, stored in _read_tensors(path):
            seen += 1
            if name in state and torch.equal(stored, state[name]):
                continue
            if not any(torch.equal(stored, t) for t in by_print.get(_fingerprint(stored), [])):
                raise CliError(f"reading back {path.name} gave a different {name}")
    if not seen:
        raise CliError(f"nothing was written to {folder}")


def _commit(tmp: Path, out_dir: Path, log) -> None:
    """Rename the finished folder into place, then say so. SIGINT is held off from just before
    the rename until the message is printed: once the output is complete, the run succeeded."""

    held = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _stop_signals()} if held else {}
    try:
        if INTERRUPTED.is_set():  # a Ctrl-C that a library swallowed still stops the run
            raise KeyboardInterrupt
        try:
            os.replace(tmp, out_dir)
        except OSError as exc:
            if out_dir.exists() or out_dir.is_symlink():
                raise CliError(f"output {out_dir} appeared while this run worked (another run writing it?); "
                               "this run wrote nothing") from exc
            raise
        COMMITTED.set()
        log(f"wrote {out_dir}")
    finally:
        # in a real process a Ctrl-C after the rename could still land in a later frame or in the
        # interpreter's teardown and exit 130 for a complete output: it stays ignored to the end
        if held and not (COMMITTED.is_set() and _PROCESS.is_set()):
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def fold_note(allow_dropout: bool) -> str:
    """What the value fold does not keep, said after every fold, whole or shard by shard."""
    return ("note: a fully masked query row (every key masked) outputs b_o + W_o b_v instead of b_o on "
            "PyTorch's SDPA path after the value fold"
            + ("; with --allow-dropout the fold is exact in eval mode only" if allow_dropout else "") + ".")


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


def _log(message: str) -> None:
    print(message, flush=True)


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (exit 2), like every other bad input; --help still prints usage."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (keybias-surgery --help lists the arguments)\n")


EXIT_INTERRUPTED = 130  # the shell's 128 + SIGINT, so a script can tell a Ctrl-C from a bad input
# A run from the command line stops the same way on SIGTERM (kill, timeout, a job scheduler) and
# SIGHUP (a closed terminal): nothing written, exit 128 + the signal's number.
TERMINATING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
INTERRUPTED = threading.Event()
_STOPPED_BY: list[int] = [signal.SIGINT]
COMMITTED = threading.Event()  # this run's output is in place: from here on the run has succeeded
_PROCESS = threading.Event()  # main() runs as the process itself (argv from the command line)


def _on_interrupt(signum, frame):
    # recorded as well as raised: a library may turn the KeyboardInterrupt into another error
    # (an ImportError while a module loads) or swallow it in a __del__
    _STOPPED_BY[0] = signum
    INTERRUPTED.set()
    raise KeyboardInterrupt


def _stop_signals() -> tuple[int, ...]:
    return (signal.SIGINT, *TERMINATING) if _PROCESS.is_set() else (signal.SIGINT,)


def _interrupted() -> int:
    """Say that the run stopped and wrote nothing; the exit code names the signal."""
    signum = _STOPPED_BY[0]
    why = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    print(f"error: {why}; nothing written", file=sys.stderr)
    return 128 + int(signum)


def _caused_by_interrupt(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt lies under `exc`: a library that loads a module lazily turns a
    Ctrl-C into its own import error, and one that sets its own SIGINT handler bypasses ours."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def main(argv: list[str] | None = None) -> int:
    INTERRUPTED.clear()
    COMMITTED.clear()
    _STOPPED_BY[0] = signal.SIGINT
    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    # called from Python (argv given), the caller's own signal handling comes back afterwards
    _PROCESS.set() if argv is None else _PROCESS.clear()
    previous = {sig: signal.signal(sig, _on_interrupt) for sig in _stop_signals()}
    try:
        return _main(argv)
    except KeyboardInterrupt:  # outside the run itself: while the arguments were parsed
        if COMMITTED.is_set():
            return 0
        return _interrupted()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_IGN if COMMITTED.is_set() and _PROCESS.is_set() else handler)


def _main(argv: list[str] | None) -> int:
    parser = _Parser(
        prog="keybias-surgery", allow_abbrev=False,  # --fold must not quietly mean --fold-value
        description="Remove key biases (and fold value biases) of a model folder, certified, into a new folder.",
        epilog="A sharded checkpoint (model.safetensors.index.json and its shards) is streamed, never loaded "
               "whole, and scanned for NaN only in the attention modules the tool would change (such a module is "
               "left as it is and reported as not handled), since its other tensors are copied unread. "
               "Exit status: 0 once OUT_DIR is written (a Ctrl-C after that changes nothing); 2 for a bad input, "
               "a refusal or a failed check, and 130 for a Ctrl-C before OUT_DIR is written, with nothing written.")
    parser.add_argument("in_dir", type=Path,
                        help="a Hugging Face model folder (config.json with model_type), timm's Hugging Face folder "
                             "(config.json with architecture) or open_clip's (open_clip_config.json), with "
                             "*.safetensors weights, in one file or sharded")
    parser.add_argument("out_dir", type=Path, help="new directory to write (must not exist)")
    parser.add_argument("--fold-value", action="store_true", help="also fold every value bias into the output bias")
    parser.add_argument("--allow-dropout", action="store_true",
                        help="fold b_v even where attention dropout is configured (exact in eval mode only)")
    parser.add_argument("--dtype", choices=DTYPES, default=None, help="convert the weights to this dtype first (single-file checkpoints; needed when one mixes dtypes)")
    args = parser.parse_args(argv)
    if args.allow_dropout and not args.fold_value:
        parser.error("--allow-dropout only applies with --fold-value")
    try:
        convert(args.in_dir, args.out_dir, fold_value=args.fold_value, dtype=args.dtype,
                allow_dropout=args.allow_dropout, log=_log)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if COMMITTED.is_set():
            return 0  # interrupted after this run's output was complete: the run succeeded
        return _interrupted()
    except Exception as exc:  # noqa: BLE001  (one line for the user, the bug's place kept visible)
        if INTERRUPTED.is_set() or _caused_by_interrupt(exc):
            return _interrupted()
        where = traceback.extract_tb(exc.__traceback__)[-1]
        print(f"error: {clip(exc) or type(exc).__name__}; nothing written "
              f"[internal {type(exc).__name__} at {Path(where.filename).name}:{where.lineno}; please report it]",
              file=sys.stderr)
        return 2
    return 0
