"""Notebook 05: the surgery tool on every model architecture of the installed transformers.

Every model type of transformers' auto mappings (`CONFIG_MAPPING_NAMES` x `MODEL_MAPPING_NAMES`)
gets its default config shrunk to a tiny one (width 16, two heads, one layer, a 99-token
vocabulary, 32-pixel images: `shrink`), a seeded random instance with every bias set to random
nonzero values, float64, eval mode. On it `strip_key_bias` and then `fold_value_bias` run as a
user would call them (inputs built by the tool from the config), and each architecture is
classified by what happened:

    removed exactly   the key bias was removed, certified on the model's own calls
    no key bias       no attention module with a key bias was found (nothing to do)
    refused           the tool refused, with its reason
    not certified     modules found, but no inputs reached them (listed, left alone)
    could not build   the tiny config or model could not be built, or its forward failed

Independently of the tool, the table records (a) the change of the whole model's float64
output after strip and fold, against the bound 2^-24 max|y| (invisible in float32), and
(b) for every refused architecture the change that zeroing its key biases by hand causes:
a refusal is needed only where that change is visible.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pandas as pd
import torch

STATUSES = ("removed exactly", "no key bias", "refused", "not certified", "could not build")
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
            "sliding_window_pattern_list")


def shrink(d: dict[str, Any]) -> dict[str, Any]:
    """A config dict made tiny in place of its sizes (recursively into sub-configs); lists of
    per-layer entries computed from the old sizes are dropped so the config recomputes them."""
    out = {}
    for key, value in d.items():
        if key in _DERIVED:
            continue
        if isinstance(value, dict) and ("model_type" in value or key.endswith("config")):
            out[key] = shrink(value)
        elif isinstance(value, bool) or not isinstance(value, (int, list)):
            out[key] = value
        elif isinstance(value, int):
            small = (SMALL["hidden"] if key in _HIDDEN else SMALL["heads"] if key in _HEADS else
                     SMALL["layers"] if key in _LAYERS else SMALL["ffn"] if key in _FFN else
                     SMALL["head_dim"] if key == "head_dim" else SMALL["kv_heads"] if key == "num_key_value_heads"
                     else SMALL["vocab"] if key == "vocab_size" else SMALL["image"] if key == "image_size"
                     else SMALL["patch"] if key == "patch_size" else SMALL["experts"] if key in _EXPERTS else None)
            out[key] = min(value, small) if small is not None and value > 0 else value
        elif key == "depths" and all(isinstance(v, int) for v in value):
            out[key] = [1] * len(value)
        elif key in ("num_heads", "num_attention_heads") and all(isinstance(v, int) for v in value):
            out[key] = [SMALL["heads"]] * len(value)
        elif key in ("hidden_sizes", "embed_dims", "dims") and all(isinstance(v, int) for v in value):
            out[key] = [SMALL["hidden"] * 2**i for i in range(len(value))]
        else:
            out[key] = value
    return out


def _ids_in_vocab(d: dict[str, Any]) -> dict[str, Any]:
    """Special token ids beyond the tiny vocabulary are mapped into it."""
    vocab = d.get("vocab_size")
    for key, value in list(d.items()):
        if isinstance(value, dict):
            d[key] = _ids_in_vocab(value)
        elif isinstance(vocab, int) and key.endswith(("token_id", "token_index")) and isinstance(value, int) \
                and value >= vocab:
            d[key] = vocab - 1 - (hash(key) % 8)
    return d


def _model_class(model_type: str):
    import transformers
    from transformers.models.auto import modeling_auto

    name = modeling_auto.MODEL_MAPPING_NAMES[model_type]
    name = name[0] if isinstance(name, (tuple, list)) else name
    return getattr(transformers, name)


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:160]}"


def _key_slots_zeroed(model) -> None:
    """Zero every key bias the tool found, by hand (no certification): the independent check
    that a refusal was needed."""
    from keybias.surgery._core import _owner
    from keybias.surgery._sites import discover

    sites, _ = discover(model)
    with torch.no_grad():
        for site in sites:
            if site.key is None:
                continue
            unit = model.get_submodule(site.unit_path) if site.unit_path else model
            param = getattr(_owner(unit, site.key), site.key.name)
            if site.key.packed:
                param[site.key.select()] = 0
            else:
                param.zero_()


def one_architecture(model_type: str, seed: int = 0) -> dict[str, Any]:
    """Build, strip, fold and check one architecture; never raises."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    warnings.filterwarnings("ignore")
    import transformers
    from transformers.models.auto import configuration_auto

    from keybias import families, surgery
    from keybias.surgery import _calls

    transformers.utils.logging.set_verbosity_error()
    row: dict[str, Any] = {"model_type": model_type, "model_class": "", "status": "could not build", "strip": "",
                           "fold": "", "reason": "", "key_bias_sites": 0, "output_change": math.nan,
                           "output_bound": math.nan, "naive_change": math.nan}
    torch.manual_seed(seed)
    try:
        cls = _model_class(model_type)
        row["model_class"] = cls.__name__
        config_cls = getattr(transformers, configuration_auto.CONFIG_MAPPING_NAMES[model_type])
        config = config_cls.from_dict(_ids_in_vocab(shrink(config_cls().to_dict())))
        model = cls(config)
        if sum(p.numel() for p in model.parameters()) > 20_000_000:
            raise ValueError("the shrunk model still has over 20M parameters")
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
        row["reason"] = _short(exc)
        return row
    from keybias.surgery._sites import discover

    sites, _ = discover(model)
    row["key_bias_sites"] = sum(1 for s in sites if s.key is not None)
    naive = None
    try:
        report = surgery.strip_key_bias(model, storage="zeros", inputs=inputs)
        changed = bool(report["modules_changed"])
        row["strip"] = "removed" if changed else "nothing to remove"
        row["status"] = "removed exactly" if changed else (
            "not certified" if row["key_bias_sites"] else "no key bias")
        if not changed:
            row["reason"] = "; ".join(u["reason"] for u in report["not_handled"][:1]) or "no key bias found"
    except surgery.SurgeryRefused as exc:
        row["strip"] = "refused"
        row["status"] = "refused"
        row["reason"] = exc.refusals[0]["reason"][:200]
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
        import copy

        probe = copy.deepcopy(model)
        _key_slots_zeroed(probe)
        with torch.no_grad():
            row["naive_change"] = _calls.change(y1, _calls.flatten(_calls.run_model(probe, inputs)))
    return row


def model_types() -> list[str]:
    from transformers.models.auto import configuration_auto, modeling_auto

    return sorted(t for t in modeling_auto.MODEL_MAPPING_NAMES if t in configuration_auto.CONFIG_MAPPING_NAMES)


def _chunk(types: list[str], seed: int) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    return [one_architecture(t, seed) for t in types]


def architecture_table(seed: int = 0, workers: int = 2, limit: int | None = None) -> tuple[pd.DataFrame, float]:
    """One row per architecture (sorted by model type) and the wall time in seconds. `limit`
    takes an evenly spaced subset (the smoke profile)."""
    types = model_types()
    if limit is not None and limit < len(types):
        step = len(types) / limit
        types = [types[int(i * step)] for i in range(limit)]
    start = time.perf_counter()
    chunks = [types[i::workers * 8] for i in range(workers * 8)]
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            rows = [r for part in pool.map(_chunk, chunks, [seed] * len(chunks)) for r in part]
    else:
        rows = _chunk(types, seed)
    seconds = time.perf_counter() - start
    table = pd.DataFrame(rows).sort_values("model_type", ignore_index=True)
    return table, seconds
