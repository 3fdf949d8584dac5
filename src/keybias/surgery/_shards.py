"""Safetensors files read and written one tensor at a time, for checkpoints larger than memory.

A sharded Hugging Face checkpoint is config.json, model.safetensors.index.json (its
weight_map names the shard of every tensor) and the shards. Nothing here holds a shard in
memory: a tensor is read with plain reads at its offsets (a memory map would count every
page it touches in the process's resident memory), and a shard is rewritten by copying its
header and its bytes in chunks, putting the few changed tensors in their places. Changed
tensors keep their dtype and shape, so the header, and every offset in it, is the same.
"""

from __future__ import annotations

import json
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

INDEX = "model.safetensors.index.json"
CHUNK = 64 * 2**20  # bytes per read while copying: the copy's memory, whatever the shard's size
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


class CheckpointError(ValueError):
    """The checkpoint's files contradict each other or are incomplete."""


def header(path: Path) -> tuple[int, dict]:
    """(offset of the data, the header's table of tensors without __metadata__)."""
    with path.open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        table = json.loads(f.read(n))
    return 8 + n, {k: v for k, v in table.items() if k != "__metadata__"}


def _names(keys, limit: int = 3) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def read_index(folder: Path) -> tuple[dict[str, str], dict[str, dict]]:
    """(weight_map: tensor -> shard file name, shard file name -> its header table), checked:
    every shard the index names exists, holds every tensor the index places in it and nothing
    else, and no safetensors file of the folder is left out of the index."""
    path = folder / INDEX
    try:
        parsed = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc})") from exc
    weight_map = parsed.get("weight_map") if isinstance(parsed, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise CheckpointError(f"{path} has no weight_map (tensor name -> shard file)")
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        shards.setdefault(shard, []).append(name)
    missing = sorted(s for s in shards if not (folder / s).is_file())
    if missing:
        count = sum(len(shards[s]) for s in missing)
        raise CheckpointError(f"{INDEX} names shard{'s' if len(missing) > 1 else ''} {_names(missing)}, not in "
                              f"{folder} ({count} tensor{'s' if count != 1 else ''} would be missing)")
    unnamed = sorted(p.name for p in folder.glob("*.safetensors") if p.name not in shards)
    if unnamed:
        raise CheckpointError(f"{_names(unnamed)} in {folder} {'is' if len(unnamed) == 1 else 'are'} not named by "
                              f"{INDEX}: remove {'it' if len(unnamed) == 1 else 'them'} or add {'its' if len(unnamed) == 1 else 'their'} tensors to the index")
    tables = {}
    for shard, names in shards.items():
        tables[shard] = table = header(folder / shard)[1]
        absent = set(names) - set(table)
        if absent:
            raise CheckpointError(f"{INDEX} places {_names(absent)} in {shard}, which does not hold "
                                  f"{'it' if len(absent) == 1 else 'them'}")
        stray = set(table) - set(names)
        if stray:
            raise CheckpointError(f"{shard} holds {_names(stray)}, which {INDEX} does not place there")
    return weight_map, tables


def read_tensors(path: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """The named tensors of one safetensors file, each read with plain reads at its offsets."""
    start, table = header(path)
    out = {}
    with path.open("rb") as f:
        for name in sorted(names, key=lambda k: table[k]["data_offsets"][0]):
            info = table[name]
            lo, hi = (int(x) for x in info["data_offsets"])
            dtype = DTYPES.get(info["dtype"])
            if dtype is None:
                raise CheckpointError(f"{path.name}: tensor {name} has dtype {info['dtype']}, which this tool "
                                      "cannot read")
            f.seek(start + lo)
            data = bytearray(f.read(hi - lo))
            flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
            out[name] = flat.reshape(info["shape"])
    return out


def _raw(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def copy_shard(src: Path, dst: Path, replacements: dict[str, torch.Tensor], stop=None) -> dict[str, int]:
    """Write `src` to `dst` with the tensors of `replacements` in place of its own (same dtype
    and shape, so the same header). Returns the CRC-32 of each tensor's bytes as written.
    `stop` (a threading.Event) ends the copy between two chunks once it is set."""
    start, table = header(src)
    crcs = {}
    with src.open("rb") as f, dst.open("wb") as out:
        out.write(f.read(start))  # the header, byte for byte
        for name, info in sorted(table.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            lo, hi = (int(x) for x in info["data_offsets"])
            if out.tell() != start + lo:
                raise CheckpointError(f"{src.name}: tensor {name} does not start where the one before it ends")
            if name in replacements:
                new = replacements[name]
                if (DTYPES.get(info["dtype"]) != new.dtype or list(new.shape) != list(info["shape"])):
                    raise CheckpointError(f"{src.name}: the changed {name} is {new.dtype} {tuple(new.shape)}, "
                                          f"the stored one {info['dtype']} {tuple(info['shape'])}")
                data = _raw(new)
                out.write(data)
                crcs[name] = zlib.crc32(data)
                continue
            f.seek(start + lo)
            crc, left = 0, hi - lo
            while left:
                if stop is not None and stop.is_set():
                    raise CheckpointError(f"the copy of {src.name} was stopped")
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    raise CheckpointError(f"{src.name} ended inside tensor {name}")
                crc = zlib.crc32(chunk, crc)
                out.write(chunk)
                left -= len(chunk)
            crcs[name] = crc
        out.flush()
    return crcs


def check_copy(path: Path, crcs: dict[str, int]) -> None:
    """Read `path` back one chunk at a time: every tensor's CRC-32 is the one written."""
    start, table = header(path)
    if set(table) != set(crcs):
        raise CheckpointError(f"reading back {path.name} gave other tensors than were written")
    with path.open("rb") as f:
        for name, info in sorted(table.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            lo, hi = (int(x) for x in info["data_offsets"])
            f.seek(start + lo)
            crc, left = 0, hi - lo
            while left:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    break
                crc = zlib.crc32(chunk, crc)
                left -= len(chunk)
            if left or crc != crcs[name]:
                raise CheckpointError(f"reading back {path.name} gave a different {name}")


class Writer:
    """Copies shards in a background thread while the caller certifies the next modules (the
    copy waits on the disk, the certification on the CPU). A shard is copied, then read back,
    as soon as every module with a tensor in it is done (`ready`), so it has all its changes."""

    def __init__(self, src: Path, dst: Path, tables: dict[str, dict]):
        self.src, self.dst, self.tables = src, dst, tables
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="keybias-shards")
        self.jobs: dict[str, object] = {}

    def _copy(self, shard: str, replacements: dict[str, torch.Tensor]) -> None:
        crcs = copy_shard(self.src / shard, self.dst / shard, replacements, stop=self.stop)
        check_copy(self.dst / shard, crcs)

    def ready(self, shard: str, replacements: dict[str, torch.Tensor]) -> None:
        if shard not in self.jobs:
            self.jobs[shard] = self.pool.submit(self._copy, shard, dict(replacements))

    def finish(self) -> None:
        """Wait for every shard; the first error of the copies is raised here."""
        missing = set(self.tables) - set(self.jobs)
        if missing:
            raise CheckpointError(f"shards never became ready: {_names(missing)}")
        for job in self.jobs.values():
            job.result()
        self.pool.shutdown(wait=True)

    def abort(self) -> None:
        self.stop.set()
        self.pool.shutdown(wait=True, cancel_futures=True)
