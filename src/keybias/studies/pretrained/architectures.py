"""Notebook 05: the surgery tool on every model architecture of the installed transformers.

Every model type of transformers' auto mappings (`CONFIG_MAPPING_NAMES` x `MODEL_MAPPING_NAMES`)
gets its default config shrunk to a tiny one (width 16, two heads, one layer, a 99-token
vocabulary, 32-pixel images: `shrink`); a config that still gives over `MAX_PARAMETERS`
parameters (counted on the meta device) is not built. The rest become a seeded random instance
with every bias set to random nonzero values, float64, eval mode. On it `strip_key_bias` and then
`fold_value_bias` run as a user would call them (inputs built by the tool from the config), and
each architecture is classified by what happened:

    removed exactly   the key bias was removed, certified on the model's own calls
    no key bias       no attention module with a key bias was found (nothing to do)
    refused           the tool refused, with its reason
    not certified     attention modules found but left alone and listed: an unknown attention
                      class, a module the inputs did not reach, or a probe that proved nothing
    could not build   the tiny config or model could not be built, or its forward failed

Independently of the tool, the table records (a) the change of the whole model's float64
output after strip and fold, against the bound 2^-24 max|y| (invisible in float32), and
(b) for every refused architecture what editing its key biases by hand (zeroed, or shifted by a
random vector) does to the whole model's output and to each refused module's own output on its
real calls: a refusal is needed only where one of them moves beyond its bound.
"""

from __future__ import annotations

import copy
import math
import os
import re
import time
import warnings
import zlib
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pandas as pd
import torch

from keybias import surgery
from keybias.studies.fixtures import families
from keybias.surgery import _calls
from keybias.surgery._core import _owner
from keybias.surgery._sites import discover

STATUSES = ("removed exactly", "no key bias", "refused", "not certified", "could not build")
# Parameters of a tiny instance, at most: a config whose sizes the shrinking cannot reach (a
# 500k-entity vocabulary, fixed-size sub-models) is not built, so every row is cheap and the
# table's time does not depend on a few large models.
MAX_PARAMETERS = 3_000_000
BOUND = 2.0**-24  # relative to max|y|: a float64 change below it cannot be seen in float32
SMALL = {"hidden": 16, "heads": 2, "kv_heads": 1, "head_dim": 8, "layers": 1, "ffn": 32, "vocab": 99,
         "image": 32, "patch": 8, "experts": 4}
_HIDDEN = ("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "embedding_size", "word_embed_proj_dim",
           "projection_dim", "d_embed", "emb_dim", "hidden_dim_model")
_HEADS = ("num_attention_heads", "n_head", "n_heads", "encoder_attention_heads", "decoder_attention_heads",
          "num_heads", "attention_heads")
_LAYERS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers",
           "num_encoder_layers", "num_decoder_layers")
_FFN = ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner", "d_ff",
        "moe_intermediate_size", "shared_expert_intermediate_size", "d_kv_ffn")
_EXPERTS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
_DERIVED = ("layer_types", "mlp_layer_types", "block_types", "attention_layers", "layers_block_type",
            "sliding_window_pattern_list", "out_features", "out_indices", "per_layer_config", "kv_source_layers",
            "num_attention_heads_per_layer")
_TOP_K = ("num_experts_per_tok", "moe_topk", "num_selected_experts", "num_experts_per_token")


def shrink(d: dict[str, Any]) -> dict[str, Any]:
    """A config dict made tiny in place of its sizes (recursively into sub-configs); lists of
    per-layer entries computed from the old sizes are dropped so the config recomputes them."""
    out = {}
    for key, value in d.items():
        if key in _DERIVED and not (key in ("out_features", "out_indices") and "depths" in d):
            continue  # (staged backbones keep their stages: only their depths shrink)
        if isinstance(value, dict) and ("model_type" in value or key.endswith("config")):
            out[key] = shrink(value)
        elif isinstance(value, bool) or not isinstance(value, (int, list)):
            out[key] = value
        elif isinstance(value, int):
            small = (SMALL["hidden"] if key in _HIDDEN else SMALL["heads"] if key in _HEADS else
                     SMALL["layers"] if key in _LAYERS else SMALL["ffn"] if key in _FFN else
                     SMALL["head_dim"] if key in ("head_dim", "d_head") else 2 if key in _TOP_K else SMALL["kv_heads"] if key == "num_key_value_heads"
                     else SMALL["vocab"] if key == "vocab_size" else SMALL["image"] if key == "image_size"
                     else SMALL["patch"] if key == "patch_size" else SMALL["experts"] if key in _EXPERTS else None)
            out[key] = min(value, small) if small is not None and value > 0 else value
        elif key == "depths" and all(isinstance(v, int) for v in value):
            out[key] = [1] * len(value)
        elif key in ("num_heads", "num_attention_heads") and all(isinstance(v, int) for v in value):
            out[key] = [SMALL["heads"]] * len(value)
        elif key == "attention_types":  # GPT-Neo: [[kinds, repeats]] expands to one kind per layer
            out[key] = [[["global"], 1]]
        elif key == "image_size" and value and all(isinstance(v, int) for v in value):
            out[key] = [SMALL["image"]] * len(value)
        elif key in ("conv_dim", "tdnn_dim") and all(isinstance(v, int) for v in value):
            out[key] = [SMALL["ffn"]] * len(value)
        elif key in ("hidden_sizes", "embed_dims", "dims") and all(isinstance(v, int) for v in value):
            out[key] = [SMALL["hidden"] * 2**i for i in range(len(value))]
        else:
            out[key] = value
    if isinstance(out.get("window_size"), int) and isinstance(out.get("depths"), list) and \
            isinstance(out.get("patch_size"), int) and isinstance(out.get("image_size"), int):
        # Windowed backbones (Swin): the last stage must still hold one window of 2x2 patches.
        out["window_size"] = 2
        out["image_size"] = out["patch_size"] * 2 * 2 ** (len(out["depths"]) - 1)
    return out


def _ids_in_vocab(d: dict[str, Any]) -> dict[str, Any]:
    """Special token ids beyond the tiny vocabulary are mapped into it."""
    vocab = d.get("vocab_size")
    for key, value in list(d.items()):
        if isinstance(value, dict):
            d[key] = _ids_in_vocab(value)
        elif isinstance(vocab, int) and key.endswith(("token_id", "token_index")) and isinstance(value, int) \
                and value >= vocab:
            d[key] = vocab - 1 - (zlib.crc32(key.encode()) % 8)  # a stable hash: str hash() is salted per process
    return d


def _transformers():
    """transformers, imported on first use (keybias[hf]); its auto mappings are
    `transformers.models.auto.configuration_auto` and `.modeling_auto`."""
    import transformers

    return transformers


def _model_class(model_type: str):
    transformers = _transformers()
    name = transformers.models.auto.modeling_auto.MODEL_MAPPING_NAMES[model_type]
    name = name[0] if isinstance(name, (tuple, list)) else name
    return getattr(transformers, name)


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:160]}"


def _key_slots_edited(model, shift: bool, seed: int) -> None:
    """Edit every key bias the tool found by hand (no certification): zero it, or (shift=True)
    add a seeded random vector as large as the bias plus one. If b_k were redundant no edit
    could move the output; the larger of the two moves is the independent witness that a
    refusal was needed (zeroing alone has little power where the random b_k is small)."""

    sites, _ = discover(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for site in sites:
            if site.key is None:
                continue
            unit = model.get_submodule(site.unit_path) if site.unit_path else model
            param = getattr(_owner(unit, site.key), site.key.name)
            view = param[site.key.select()] if site.key.packed else param
            new = view + (1 + float(view.abs().max())) * torch.randn(view.shape, generator=gen,
                                                                      dtype=torch.float64).to(view.dtype) \
                if shift else torch.zeros_like(view)
            if site.key.packed:
                param[site.key.select()] = new
            else:
                param.copy_(new)


def _unit_moves(model, inputs, seed: int) -> tuple[float, float]:
    """Largest change, over the attention modules with a key bias, of a module's own output on
    its real calls (captured from the whole model) when its key bias is edited by hand (zeroed,
    or shifted as in `_key_slots_edited`), and that module's rounding bound. The tool certifies
    modules, and a module's output can carry rows that the model later drops (padding added
    inside the model): there b_k can be visible to the module and not to the model."""


    sites, _ = discover(model)
    paths = [s.unit_path for s in sites if s.key is not None]
    _, calls = _calls.capture(model, inputs, paths)
    worst, limit = 0.0, math.nan
    for path in dict.fromkeys(paths):
        unit = model.get_submodule(path) if path else model
        for call in calls.get(path, []):
            y0 = _calls.unit_output(unit, call)
            for shift in (False, True):
                edited = copy.deepcopy(unit)
                _key_slots_edited(edited, shift, seed)
                ratio_now = _calls.change(y0, _calls.unit_output(edited, call))
                b = _calls.bound(y0)
                if b > 0 and (math.isnan(limit) or ratio_now / b > worst / limit):
                    worst, limit = ratio_now, b
    return worst, limit


def one_architecture(model_type: str, seed: int = 0) -> dict[str, Any]:
    """Build, strip, fold and check one architecture; never raises."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    warnings.filterwarnings("ignore")
    transformers = _transformers()
    configuration_auto = transformers.models.auto.configuration_auto

    transformers.utils.logging.set_verbosity_error()
    row: dict[str, Any] = {"model_type": model_type, "model_class": "", "status": "could not build", "strip": "",
                           "fold": "", "reason": "", "key_bias_sites": 0, "output_change": math.nan,
                           "output_bound": math.nan, "naive_change": math.nan,
                           "naive_unit_change": math.nan, "naive_unit_bound": math.nan,
                           "parameters": 0}
    torch.manual_seed(seed)
    try:
        cls = _model_class(model_type)
        row["model_class"] = cls.__name__
        config_cls = getattr(transformers, configuration_auto.CONFIG_MAPPING_NAMES[model_type])
        # Mixture-of-experts layers in float64 need the plain loop over experts (grouped matrix
        # products take float32 and below only).
        config = config_cls.from_dict({**_ids_in_vocab(shrink(config_cls().to_dict())),
                                       "experts_implementation": "eager"})
        try:  # counted on the meta device first: building and initialising a large model is slow
            with torch.device("meta"):
                size = sum(p.numel() for p in cls(config).parameters())
        except Exception:  # noqa: BLE001  (some constructors need real tensors: count after building)
            size = None
        row["parameters"] = size or 0
        if size is not None and size > MAX_PARAMETERS:
            raise ValueError(f"the shrunk config still has {size / 1e6:.1f}M parameters "
                             f"(cap {MAX_PARAMETERS / 1e6:g}M)")
        model = cls(config)
        row["parameters"] = sum(p.numel() for p in model.parameters())
        if row["parameters"] > MAX_PARAMETERS:
            raise ValueError(f"the shrunk config still has {row['parameters'] / 1e6:.1f}M parameters "
                             f"(cap {MAX_PARAMETERS / 1e6:g}M)")
        model = families.randomize_biases(model, seed + 1).double().eval()
        inputs = _calls.example_inputs(model, seed=seed)
        if inputs is None:
            raise ValueError(f"no inputs built for main input {getattr(model, 'main_input_name', '?')!r}")
        with torch.no_grad():
            y0 = _calls.flatten(_calls.run_model(model, inputs))
        if not y0.numel() or not bool(torch.isfinite(y0).all()):
            raise ValueError("the forward gave no finite floating output")
    except BaseException as exc:  # noqa: BLE001  (recorded as the reason it could not be built)
        if isinstance(exc, KeyboardInterrupt):
            raise
        row["reason"] = ("needs timm (not installed)" if isinstance(exc, ImportError) and "timm" in str(exc)
                         else _short(exc))
        return row

    sites, _ = discover(model)
    row["key_bias_sites"] = sum(1 for s in sites if s.key is not None)
    naive = None
    try:
        report = surgery.strip_key_bias(model, storage="zeros", inputs=inputs)
        changed = bool(report["modules_changed"])
        row["strip"] = "removed" if changed else "nothing to remove"
        # An attention module the tool could not place (an unknown class) may hold a key bias:
        # it is listed as not certified, never as "no key bias".
        row["status"] = "removed exactly" if changed else (
            "not certified" if row["key_bias_sites"] or report["not_handled"] else "no key bias")
        if not changed:
            row["reason"] = "; ".join(u["reason"] for u in report["not_handled"][:1]) or "no key bias found"
    except surgery.SurgeryRefused as exc:
        row["strip"] = "refused"
        row["status"] = "refused"
        row["reason"] = exc.refusals[0]["reason"]
        naive = True  # the refusal left the model unchanged: measure what zeroing b_k would do
    except Exception as exc:  # noqa: BLE001
        row["strip"] = "error"
        row["status"] = "could not build"
        row["reason"] = f"surgery raised {_short(exc)}"
        return row
    try:
        report = surgery.fold_value_bias(model, storage="zeros", inputs=inputs, allow_dropout=True,
                                         assume_no_fully_masked_rows=True)
        row["fold"] = "folded" if report["modules_changed"] else "nothing to fold"
    except surgery.SurgeryRefused as exc:
        row["fold"] = "refused: " + exc.refusals[0]["reason"][:120]
    except Exception as exc:  # noqa: BLE001
        row["fold"] = f"error: {_short(exc)}"
    with torch.no_grad():
        y1 = _calls.flatten(_calls.run_model(model, inputs))
    row["output_change"] = _calls.change(y0, y1)
    row["output_bound"] = BOUND * float(y0.abs().max())
    if naive is not None:
        moves = []
        for shift in (False, True):
            probe = copy.deepcopy(model)
            _key_slots_edited(probe, shift, seed + 2)
            with torch.no_grad():
                moves.append(_calls.change(y1, _calls.flatten(_calls.run_model(probe, inputs))))
        row["naive_change"] = max(moves)
        row["naive_unit_change"], row["naive_unit_bound"] = _unit_moves(model, inputs, seed + 2)
    return row


def model_types() -> list[str]:
    auto = _transformers().models.auto
    configuration_auto, modeling_auto = auto.configuration_auto, auto.modeling_auto
    return sorted(t for t in modeling_auto.MODEL_MAPPING_NAMES if t in configuration_auto.CONFIG_MAPPING_NAMES)


def _timed(model_type: str, seed: int) -> dict[str, Any]:
    start = time.perf_counter()
    row = one_architecture(model_type, seed)
    row["seconds"] = time.perf_counter() - start  # machine-dependent: reported, never judged
    return row


def _chunk(types: list[str], seed: int) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    return [_timed(t, seed) for t in types]


def _exact_text(text: str) -> str:
    """A reason without its measured numbers (they are in the numeric columns), so that the
    text column is the same on every machine."""
    return re.sub(r"-?\d+\.\d+(e[-+]?\d+)?|\d+e[-+]\d+", "#", text)


def architecture_table(types: list[str] | None = None, seed: int = 0,
                       workers: int = 2) -> tuple[pd.DataFrame, pd.Series]:
    """One row per architecture (sorted by model type) and the seconds each took (machine-
    dependent, kept out of the table). `types=None` or ["all"] takes every model type."""
    known = model_types()
    if types is None or list(types) == ["all"]:
        types = known
    unknown = sorted(set(types) - set(known))
    if unknown:
        raise ValueError(f"unknown model types {unknown}; choose from transformers' model types or ['all']")
    types = sorted(set(types))
    chunks = [c for c in (types[i::workers * 8] for i in range(workers * 8)) if c]
    if workers > 1 and len(types) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            rows = [r for part in pool.map(_chunk, chunks, [seed] * len(chunks)) for r in part]
    else:
        rows = _chunk(types, seed)
    table = pd.DataFrame(rows).sort_values("model_type", ignore_index=True)
    seconds = table.pop("seconds")
    seconds.index = table["model_type"]
    for col in ("reason", "fold"):
        table[col] = table[col].map(_exact_text)
    return table, seconds
