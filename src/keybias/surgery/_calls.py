"""Certification as the model calls it: inputs the whole model accepts, each attention unit's
real call captured with forward hooks, and probes of a bias slot on those calls.

What is captured. One float64 eval-mode copy of the model runs once on `inputs` (given by the
caller, or built by `example_inputs` from the config: token ids with padding, pixel values,
audio features, decoder ids). A forward hook with kwargs on every planned unit records the
positional and keyword arguments of its first calls: hidden states, attention masks, position
tensors (rotary cos/sin, position ids, relative biases), cache switches, exactly as passed.

What is probed. For every captured call, and for a copy of it whose hidden-state tensors are
replaced by seeded random ones of the same shape and scale (masks and position tensors kept),
the unit's output is compared before and after (a) the planned change, (b) a random
perturbation of the key-bias slot (the redundancy probe: a directional finite difference of the
Jacobian with respect to b_k, which is exactly zero when b_k only shifts each score row) and
(c) the same perturbation of the query slot (the control: it must move the output, or the probe
exercised nothing). All comparisons use one bound fixed from the float32 format: a float64
change of at most 2^-24 max|y| (float32's unit roundoff of the output) cannot be seen in float32,
and is still 2^28 times float64's own rounding.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

RELATIVE_BOUND = 2.0**-24
HIDDEN_NAMES = ("hidden_states", "encoder_hidden_states", "key_value_states", "query", "key", "value", "x",
                "query_input", "key_input", "value_input")  # the last three: TransformerLens
CALLS_PER_UNIT = 2


def flatten(out: Any) -> torch.Tensor:
    """Every floating tensor of a module's output, flattened into one float64 vector."""
    leaves: list[torch.Tensor] = []

    def collect(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            if obj.is_floating_point():
                leaves.append(obj.detach().double().reshape(-1))
        elif isinstance(obj, (tuple, list)):
            for item in obj:
                collect(item)
        elif isinstance(obj, dict):
            for item in obj.values():
                collect(item)
        elif hasattr(obj, "to_tuple"):
            collect(obj.to_tuple())

    collect(out)
    return torch.cat(leaves) if leaves else torch.zeros(0, dtype=torch.float64)


def bound(y: torch.Tensor) -> float:
    return RELATIVE_BOUND * float(y.abs().max()) if y.numel() else 0.0


def change(y0: torch.Tensor, y1: torch.Tensor) -> float:
    if y0.shape != y1.shape or y0.numel() == 0:
        return math.inf
    diff = (y1 - y0).abs()
    return float(diff.max()) if bool(torch.isfinite(diff).all()) else math.inf


# ---------------------------------------------------------------------------- model inputs

def _accepts(model: nn.Module) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def _sub(config, *names):
    for name in names:
        sub = getattr(config, name, None)
        if sub is not None:
            return sub
    return config


def _timm_inputs(model: nn.Module, seed: int, batch: int) -> torch.Tensor | None:
    """Images for a timm model: channels and size from pretrained_cfg['input_size'], the size
    the model was built for where it says (patch_embed.img_size, set by create_model(img_size=))."""
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
    size = cfg.get("input_size") if isinstance(cfg, dict) else None
    if not (isinstance(size, (tuple, list)) and len(size) == 3 and all(isinstance(v, int) for v in size)):
        return None
    channels, height, width = size
    built = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if isinstance(built, (tuple, list)) and len(built) == 2 and all(isinstance(v, int) for v in built):
        height, width = built
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, channels, height, width, generator=gen).to(dtype)


def _open_clip_shape(model: nn.Module) -> tuple[int, int, int] | None:
    """(image size, context length, vocabulary) of an open_clip CLIP, else None."""
    size = getattr(getattr(model, "visual", None), "image_size", None)
    size = size[0] if isinstance(size, (tuple, list)) else size
    ctx, vocab = getattr(model, "context_length", None), getattr(model, "vocab_size", None)
    if all(isinstance(v, int) and v > 0 for v in (size, ctx, vocab)):
        return size, ctx, vocab
    return None


def _open_clip_inputs(model: nn.Module, seed: int, batch: int, length: int):
    """An open_clip CLIP's forward(image, text): random images and token ids, both towers run."""
    size, ctx, vocab = _open_clip_shape(model)
    gen = torch.Generator().manual_seed(seed)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    image = torch.randn(batch, 3, size, size, generator=gen).to(dtype)
    text = torch.randint(1, vocab, (batch, ctx), generator=gen)
    return (image, text), {}


def _text_length(config, length: int) -> int:
    """The sequence length the model accepts: a model that fixes it in its config (Nystromformer's
    segment_means_seq_len) gets that length."""
    fixed = getattr(config, "segment_means_seq_len", None)
    return fixed if isinstance(fixed, int) and 0 < fixed <= 1024 else length


def example_inputs(model: nn.Module, seed: int = 0, batch: int = 2, length: int = 8) -> Any:
    """Inputs a model accepts: keyword inputs for a Hugging Face model, built from its config;
    an image batch for a timm model (from its pretrained_cfg); None for other modules.

    Token ids (with the second example's last two positions padded, never a whole row), pixel
    values, audio features or waveforms, and decoder ids for encoder-decoders, as the forward's
    signature asks; use_cache=False so that no call fills a cache."""
    config = getattr(model, "config", None)
    lens = getattr(model, "cfg", None)
    if config is None and isinstance(getattr(lens, "d_vocab", None), int) and lens.d_vocab > 0:
        # TransformerLens HookedTransformer: token ids, at most its context length
        gen = torch.Generator().manual_seed(seed)
        n = min(length, getattr(lens, "n_ctx", length) or length)
        return torch.randint(0, lens.d_vocab, (batch, n), generator=gen)
    if config is None and _open_clip_shape(model) is not None:
        return _open_clip_inputs(model, seed, batch, length)
    if config is None or not hasattr(config, "to_dict"):
        return _timm_inputs(model, seed, batch)
    length = _text_length(config, length)
    accepts = _accepts(model)
    gen = torch.Generator().manual_seed(seed)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    inputs: dict[str, Any] = {}
    main = getattr(model, "main_input_name", "input_ids")
    text = _sub(config, "text_config", "decoder")
    vocab = getattr(text, "vocab_size", None) or getattr(config, "vocab_size", None)
    wants_ids = main == "input_ids" or ("input_ids" in accepts and "pixel_values" in accepts)
    if wants_ids and "input_ids" in accepts and isinstance(vocab, int) and vocab > 4:
        ids = torch.randint(min(4, vocab - 1), min(vocab, 100), (batch, length), generator=gen)
        inputs["input_ids"] = ids
        if "attention_mask" in accepts:
            mask = torch.ones(batch, length, dtype=torch.long)
            mask[-1, -2:] = 0
            inputs["attention_mask"] = mask
    if main == "pixel_values" or ("pixel_values" in accepts and "input_ids" in inputs):
        vision = _sub(config, "vision_config")
        size = getattr(vision, "image_size", None) or getattr(config, "image_size", 32)
        size = size[0] if isinstance(size, (list, tuple)) else size
        if isinstance(size, dict):
            size = size.get("height", 32)
        channels = getattr(vision, "num_channels", 3)
        inputs["pixel_values"] = torch.randn(batch, channels, size, size, generator=gen).to(dtype)
    if main == "input_features":
        audio = _sub(config, "audio_config", "encoder")
        bins = getattr(audio, "num_mel_bins", None) or getattr(config, "num_mel_bins", 80)
        frames = 2 * (getattr(config, "max_source_positions", 0) or 8)
        inputs["input_features"] = torch.randn(batch, bins, frames, generator=gen).to(dtype)
    if main == "input_values":
        inputs["input_values"] = torch.randn(batch, 1600, generator=gen).to(dtype)
    if not inputs:
        return None
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in accepts:
        dec_vocab = getattr(_sub(config, "decoder"), "vocab_size", None) or vocab or 10
        inputs["decoder_input_ids"] = torch.randint(min(4, dec_vocab - 1), min(dec_vocab, 100), (batch, 4),
                                                    generator=gen)
    if "use_cache" in accepts:
        inputs["use_cache"] = False
    return inputs


def run_model(model: nn.Module, inputs: Any) -> Any:
    """One forward with the global RNG seeded (and restored after): models that draw random
    numbers in eval mode (MAE's patch masking, VITS's durations) give the same draws before
    and after a change, so the comparison sees the change alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return _forward(model, inputs)


def _forward(model: nn.Module, inputs: Any) -> Any:
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, tuple) and len(inputs) == 2 and isinstance(inputs[1], dict):
        return model(*inputs[0], **inputs[1])
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def to_float64(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.double() if obj.is_floating_point() else obj
    if isinstance(obj, tuple):
        return tuple(to_float64(x) for x in obj)
    if isinstance(obj, list):
        return [to_float64(x) for x in obj]
    if isinstance(obj, dict):
        return {k: to_float64(v) for k, v in obj.items()}
    return obj


# ---------------------------------------------------------------------------- capture

Call = tuple[tuple, dict]


def capture(model: nn.Module, inputs: Any, paths: list[str],
            outputs: dict[str, list[torch.Tensor]] | None = None) -> tuple[torch.Tensor, dict[str, list[Call]]]:
    """Run `model` once on `inputs`; return its flattened output and the first calls of each
    module in `paths` (args, kwargs as passed). With `outputs`, the flattened output of each of
    those calls is put there too (in the model's dtype, as float64 vectors)."""
    calls: dict[str, list[Call]] = {p: [] for p in paths}
    hooks = []
    for path in dict.fromkeys(paths):
        module = model.get_submodule(path) if path else model
        if outputs is not None:
            outputs[path] = []

            def out_hook(_m, _args, _kwargs, out, path=path):
                if len(outputs[path]) < CALLS_PER_UNIT:
                    outputs[path].append(flatten(out))
            hooks.append(module.register_forward_hook(out_hook, with_kwargs=True))

        # A pre-hook: stateful arguments (a key/value cache the call appends to) are copied as
        # they were before the call, so a replayed call sees what the real one saw.
        def hook(_m, args, kwargs, path=path):
            if len(calls[path]) < CALLS_PER_UNIT:
                calls[path].append((tuple(_snapshot(a) for a in args),
                                    {k: _snapshot(v) for k, v in kwargs.items()}))
        hooks.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            y = flatten(run_model(model, inputs))
    finally:
        for h in hooks:
            h.remove()
    return y, calls


def randomized(call: Call, gen: torch.Generator) -> Call:
    """The same call with its hidden-state tensors (the first positional floating tensor and
    keyword tensors named like hidden states) replaced by random ones of the same shape, mean
    and spread; masks, position tensors and switches are kept."""
    args, kwargs = call

    def fresh(t: torch.Tensor) -> torch.Tensor:
        spread = float(t.std()) if t.numel() > 1 else 1.0
        spread = spread if math.isfinite(spread) and spread > 0 else 1.0
        noise = torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype)
        return noise * spread + t.mean()

    new_args = list(args)
    for i, a in enumerate(new_args):
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.ndim >= 2:
            new_args[i] = fresh(a)
            break
    new_kwargs = {k: fresh(v) if (k in HIDDEN_NAMES and isinstance(v, torch.Tensor) and v.is_floating_point())
                  else v for k, v in kwargs.items()}
    return tuple(new_args), new_kwargs


def _stateful(obj: Any) -> bool:
    """A mutable object a call may change (a transformers Cache), directly or inside a tuple."""
    if isinstance(obj, (tuple, list)):
        return any(_stateful(x) for x in obj)
    return not isinstance(obj, (torch.Tensor, int, float, bool, str, type(None))) and callable(
        getattr(obj, "update", None)) and type(obj).__name__.endswith("Cache")


def _snapshot(obj: Any) -> Any:
    return copy.deepcopy(obj) if _stateful(obj) else obj


def unit_output(unit: nn.Module, call: Call, first: bool = False) -> torch.Tensor:
    """The unit's output on a captured call (its first element only if `first`); stateful
    arguments are fresh copies each time."""
    args = tuple(_snapshot(a) for a in call[0])
    kwargs = {k: _snapshot(v) for k, v in call[1].items()}
    with torch.no_grad():
        out = unit(*args, **kwargs)
    if first and isinstance(out, (tuple, list)) and out:
        out = out[0]
    return flatten(out)


def _batch_size(call: Call) -> int | None:
    """The batch size of a call: dim 0 of its hidden states (the tensor randomized() replaces)."""
    args, kwargs = call
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.ndim >= 2:
            return int(a.shape[0])
    for k, v in kwargs.items():
        if k in HIDDEN_NAMES and isinstance(v, torch.Tensor) and v.is_floating_point() and v.ndim >= 2:
            return int(v.shape[0])
    return None


def _merge_values(values: list, batch: int) -> tuple[bool, Any]:
    first = values[0]
    if isinstance(first, torch.Tensor):
        if not all(isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype
                   for v in values) or first.ndim == 0:
            return False, None
        same = all(v is first or torch.equal(v, first) for v in values[1:])
        if first.shape[0] == 1 and same:
            return True, first  # broadcast over the batch (a mask or position table): kept as is
        if first.shape[0] == batch:
            return True, torch.cat(values, dim=0)
        return False, None
    if isinstance(first, (tuple, list)) or _stateful(first):
        return False, None  # nested or stateful arguments (caches): not merged
    return all(v is first or (type(v) is type(first) and v == first) for v in values[1:]), first


def merge(calls: list[Call]) -> tuple[Call, int] | None:
    """One call that carries every call of `calls` along the batch dimension, and the batch size
    of each, or None where that is not certain: the calls must have the same structure and
    shapes; each tensor argument either carries the batch (dim 0 = the hidden states' batch size;
    concatenated) or is the same in every call with dim 0 = 1 (broadcast; kept); every other
    argument is equal in every call; no nested or stateful argument. Whether the merged call
    computes what the separate calls compute is checked by the caller, against the captured
    outputs."""
    if len(calls) < 2:
        return None
    batch = _batch_size(calls[0])
    if batch is None or any(_batch_size(c) != batch for c in calls):
        return None
    n_args, keys = len(calls[0][0]), list(calls[0][1])
    if any(len(c[0]) != n_args or list(c[1]) != keys for c in calls):
        return None
    args = []
    for i in range(n_args):
        ok, value = _merge_values([c[0][i] for c in calls], batch)
        if not ok:
            return None
        args.append(value)
    kwargs = {}
    for k in keys:
        ok, value = _merge_values([c[1][k] for c in calls], batch)
        if not ok:
            return None
        kwargs[k] = value
    return (tuple(args), kwargs), batch


def merged_outputs(unit: nn.Module, merged: tuple[Call, int], n: int) -> list[torch.Tensor] | None:
    """The unit's output on a merged call, split back into the `n` calls' flattened outputs (as
    unit_output gives them), or None if an output tensor does not carry the merged batch."""
    call, batch = merged
    with torch.no_grad():
        out = unit(*call[0], **call[1])
    leaves: list[torch.Tensor] = []

    def collect(obj: Any) -> bool:
        if isinstance(obj, torch.Tensor):
            if obj.is_floating_point():
                if obj.ndim == 0 or obj.shape[0] != n * batch:
                    return False
                leaves.append(obj.detach().double())
            return True
        if isinstance(obj, (tuple, list)):
            return all(collect(item) for item in obj)
        if isinstance(obj, dict):
            return all(collect(item) for item in obj.values())
        if hasattr(obj, "to_tuple"):
            return collect(obj.to_tuple())
        return True

    if not collect(out) or not leaves:
        return None
    return [torch.cat([leaf[i * batch:(i + 1) * batch].reshape(-1) for leaf in leaves]) for i in range(n)]


def outputs(unit: nn.Module, calls: list[Call], merged: tuple[Call, int] | None = None) -> list[torch.Tensor]:
    """The unit's flattened output on each call: one forward on the merged call where given
    (and splittable), else one forward per call."""
    if merged is not None:
        split = merged_outputs(unit, merged, len(calls))
        if split is not None:
            return split
    return [unit_output(unit, c) for c in calls]


def probe(unit: nn.Module, calls: list[Call], edit: Callable[[nn.Module], Any],
          before: list[torch.Tensor] | None = None, merged: tuple[Call, int] | None = None,
          keep: list[torch.Tensor] | None = None) -> tuple[float, float]:
    """Largest output change over the calls when `edit` is applied to (a state-restored) unit,
    and the bound for it. `edit` must be undone by the caller (probes run on throwaway copies);
    `before`, the unit's outputs on the calls, is computed here unless given; `merged` (from
    merge(calls), checked by the caller) runs all the calls as one batch; `keep` receives the
    outputs after the edit."""
    before = outputs(unit, calls, merged) if before is None else before
    edit(unit)
    after = outputs(unit, calls, merged)
    if keep is not None:
        keep.extend(after)
    worst, limit = 0.0, math.inf
    for y0, y1 in zip(before, after, strict=True):
        worst = max(worst, change(y0, y1))
        limit = min(limit, bound(y0))
    return worst, limit
