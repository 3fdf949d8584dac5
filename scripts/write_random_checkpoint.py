"""Write a random-weight Hugging Face checkpoint of a named model's shape, one tensor at a time.

    python scripts/write_random_checkpoint.py OUT_DIR --shape opt-6.7b --dtype bfloat16

OUT_DIR gets config.json, shards of at most --shard-gb gigabytes and model.safetensors.index.json
(or one model.safetensors where one shard holds everything), in the layout save_pretrained writes
(tied tensors stored once). The model is built on the meta
device only for its tensors' names and shapes; each tensor is drawn, converted and written
before the next is drawn, so the memory needed is one tensor, whatever the model's size.
Weights (two or more dimensions) are N(0, 0.02^2), norm scales 1 + N(0, 0.1^2), biases
N(0, 0.5^2) (large biases, so that a wrong change to one would show), seeded per tensor.
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from pathlib import Path

# name -> (transformers config class, keyword arguments, architecture): the shapes of the named models
SHAPES = {
    "bert-base": ("BertConfig", {}, "BertModel"),
    "gpt2-medium": ("GPT2Config", {"n_embd": 1024, "n_layer": 24, "n_head": 16}, "GPT2Model"),
    "opt-1.3b": ("OPTConfig", {"hidden_size": 2048, "num_hidden_layers": 24, "ffn_dim": 8192,
                               "num_attention_heads": 32, "word_embed_proj_dim": 2048}, "OPTForCausalLM"),
    "opt-6.7b": ("OPTConfig", {"hidden_size": 4096, "num_hidden_layers": 32, "ffn_dim": 16384,
                               "num_attention_heads": 32, "word_embed_proj_dim": 4096}, "OPTForCausalLM"),
}
SAFETENSORS_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def _layout(shape: str):
    """(config, [(name, shape)] of the tensors save_pretrained stores, tied ones once)."""
    import torch
    import transformers

    config_name, kwargs, architecture = SHAPES[shape]
    config = getattr(transformers, config_name)(**kwargs)
    config.architectures = [architecture]
    with torch.device("meta"):
        model = getattr(transformers, architecture)(config)
    seen, tensors = set(), []
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) not in seen:
            seen.add(id(t))
            tensors.append((name, tuple(t.shape)))
    return config, tensors


def _draw(name: str, shape: tuple, dtype, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    if len(shape) >= 2:
        t = torch.randn(shape, generator=gen).mul_(0.02)
    elif "norm" in name.lower() or "ln" in (name.split(".")[-2:-1] or [""])[0]:
        t = torch.randn(shape, generator=gen).mul_(0.1).add_(1.0)
    else:
        t = torch.randn(shape, generator=gen).mul_(0.5)
    return t.to(dtype)


def write(out: Path, shape: str, dtype_name: str, shard_gb: float) -> dict:
    import torch

    if out.exists():
        raise SystemExit(f"error: {out} already exists; choose a new directory")
    dtype = getattr(torch, dtype_name)
    size = torch.empty(0, dtype=dtype).element_size()
    config, tensors = _layout(shape)
    config.torch_dtype = dtype_name
    limit = int(shard_gb * 1e9)
    shards: list[list[tuple[str, tuple]]] = [[]]
    used = 0
    for name, dims in tensors:
        n = size * int(torch.Size(dims).numel())
        if shards[-1] and used + n > limit:
            shards.append([])
            used = 0
        shards[-1].append((name, dims))
        used += n
    out.mkdir(parents=True)
    config.save_pretrained(str(out))
    weight_map, total = {}, 0
    for i, members in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        table, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, dims in members:
            n = size * int(torch.Size(dims).numel())
            table[name] = {"dtype": SAFETENSORS_DTYPE[dtype_name], "shape": list(dims),
                           "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = file
        head = json.dumps(table, separators=(",", ":")).encode()
        head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned, as safetensors writes it
        with (out / file).open("wb") as f:
            f.write(len(head).to_bytes(8, "little"))
            f.write(head)
            for name, dims in members:
                t = _draw(name, dims, dtype, zlib.crc32(name.encode()))
                f.write(t.reshape(-1).view(torch.uint8).numpy().data)
                del t
        total += offset
    if len(shards) == 1:  # one file, named as save_pretrained names it, and no index
        (out / file).rename(out / "model.safetensors")
    else:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return {"shards": len(shards), "bytes": total, "largest_shard_bytes": max(
        sum(size * int(torch.Size(d).numel()) for _, d in m) for m in shards)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="new directory to write")
    parser.add_argument("--shape", choices=list(SHAPES), required=True)
    parser.add_argument("--dtype", choices=list(SAFETENSORS_DTYPE), default="bfloat16")
    parser.add_argument("--shard-gb", type=float, default=5.0, help="largest shard, in gigabytes (10^9 bytes)")
    args = parser.parse_args(argv)
    if not args.shard_gb > 0:
        parser.error("--shard-gb must be positive")
    print(json.dumps(write(args.out, args.shape, args.dtype, args.shard_gb)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
