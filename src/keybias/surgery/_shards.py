"""Safetensors files read and written one tensor at a time, for checkpoints larger than memory.

A sharded Hugging Face checkpoint is config.json, model.safetensors.index.json (its
weight_map names the shard of every tensor) and the shards. Nothing here holds a shard in
memory. A shard is rewritten in one pass that reads each of its bytes once: its header is
copied, the tensors the caller asks for are read into memory with plain reads (a memory map
would count every page it touches in the process's resident memory), written from there and
handed over, and every other run of bytes is copied by the kernel (copy_file_range), without
passing through the process. The few changed tensors are then written in their places:
changed tensors keep their dtype and shape, so the header, and every offset in it, is the same.

The written shard is checked without a second full read: its size and header equal the
source's, every changed tensor reads back as the value given, and every other tensor's first
and last bytes read back as the source's. That catches a shard cut short, a tensor written at
the wrong offset, a byte range left out or copied from the wrong place, and a change that did
not land; it does not compare every byte of an unchanged tensor again. (A read-back just after
writing is served from the page cache, not the disk, so a full one would not check the disk
either.) Every write and kernel copy is checked to have moved all its bytes.
"""

from __future__ import annotations

import errno
import json
import os
import queue
import threading
from pathlib import Path

import torch

INDEX = "model.safetensors.index.json"
CHUNK = 64 * 2**20  # bytes per kernel copy (between two, a stop request is seen)
EDGE = 4096  # bytes read back at each end of an unchanged tensor
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


def _raw(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _write_all(fd: int, data, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise CheckpointError("a write to the output wrote nothing (disk full?)")
        view, offset = view[n:], offset + n


def _read_exactly(fd: int, n: int, offset: int, what: str, into: bytearray | None = None) -> bytearray:
    data = bytearray(n) if into is None else into
    view, got = memoryview(data), 0
    while got < n:
        k = os.preadv(fd, [view[got:]], offset + got)
        if k <= 0:
            raise CheckpointError(f"{what} ended inside its tensors")
        got += k
    return data


_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF}


def _copy_range(fin: int, fout: int, lo: int, hi: int, what: str, stop) -> None:
    """Bytes lo..hi of fin to the same offsets of fout: by the kernel where the file system
    allows it, else by plain reads and writes of CHUNK bytes."""
    kernel = hasattr(os, "copy_file_range")
    while lo < hi:
        if stop is not None and stop.is_set():
            raise CheckpointError(f"the copy of {what} was stopped")
        n = min(CHUNK, hi - lo)
        if kernel:
            try:
                done = os.copy_file_range(fin, fout, n, lo, lo)
            except OSError as exc:
                if exc.errno not in _NO_KERNEL_COPY:
                    raise
                kernel = False
                continue
            if done <= 0:
                raise CheckpointError(f"{what} ended inside its tensors")
        else:
            _write_all(fout, _read_exactly(fin, n, lo, what), lo)
            done = n
        lo += done


def _ordered(table: dict) -> list[tuple[str, dict]]:
    return sorted(table.items(), key=lambda kv: kv[1]["data_offsets"][0])


def stream_shard(src: Path, dst: Path, wanted: set[str], deliver, stop=None, take=None) -> None:
    """Write `src` to `dst` unchanged, reading each byte once: each tensor named in `wanted` is
    read into memory, written from there and passed to deliver(name, tensor) in file order;
    all other bytes are copied by the kernel. `stop` (a threading.Event) ends the copy between
    two tensors or chunks once it is set; take(n), where given, supplies the n-byte bytearray
    a tensor is read into."""
    start, table = header(src)
    with src.open("rb") as f, dst.open("wb") as out:
        fin, fout = f.fileno(), out.fileno()
        _write_all(fout, _read_exactly(fin, start, 0, src.name), 0)  # the header, byte for byte
        pos, copy_from = start, start
        for name, info in _ordered(table):
            lo, hi = (start + int(x) for x in info["data_offsets"])
            if lo != pos:
                raise CheckpointError(f"{src.name}: tensor {name} does not start where the one before it ends")
            pos = hi
            if name not in wanted:
                continue
            dtype = DTYPES.get(info["dtype"])
            if dtype is None:
                raise CheckpointError(f"{src.name}: tensor {name} has dtype {info['dtype']}, which this tool "
                                      "cannot read")
            _copy_range(fin, fout, copy_from, lo, src.name, stop)
            data = _read_exactly(fin, hi - lo, lo, src.name, take(hi - lo) if take is not None else None)
            _write_all(fout, data, lo)
            copy_from = hi
            flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
            deliver(name, flat.reshape(info["shape"]))
        _copy_range(fin, fout, copy_from, pos, src.name, stop)
        if os.fstat(fin).st_size != pos:
            raise CheckpointError(f"{src.name} has {os.fstat(fin).st_size - pos} bytes after its last tensor")


def _checked(src: Path, info: dict, name: str, new: torch.Tensor) -> bytes:
    if DTYPES.get(info["dtype"]) != new.dtype or list(new.shape) != list(info["shape"]):
        raise CheckpointError(f"{src.name}: the changed {name} is {new.dtype} {tuple(new.shape)}, "
                              f"the stored one {info['dtype']} {tuple(info['shape'])}")
    return _raw(new)


def patch(src: Path, dst: Path, replacements: dict[str, torch.Tensor]) -> None:
    """Write each tensor of `replacements` into `dst` (a copy of `src`) at its place."""
    start, table = header(src)
    fd = os.open(dst, os.O_WRONLY)
    try:
        for name, new in replacements.items():
            lo = start + int(table[name]["data_offsets"][0])
            _write_all(fd, _checked(src, table[name], name, new), lo)
    finally:
        os.close(fd)


def check_written(src: Path, dst: Path, replacements: dict[str, torch.Tensor]) -> None:
    """`dst` is `src` with `replacements` in place (see the module docstring for what this
    reads back and what it guarantees); raises CheckpointError naming the first difference."""
    start, table = header(src)
    with src.open("rb") as a, dst.open("rb") as b:
        fa, fb = a.fileno(), b.fileno()
        if os.fstat(fb).st_size != os.fstat(fa).st_size:
            raise CheckpointError(f"the written {dst.name} has {os.fstat(fb).st_size} bytes, not "
                                  f"{os.fstat(fa).st_size}")
        if _read_exactly(fb, start, 0, dst.name) != _read_exactly(fa, start, 0, src.name):
            raise CheckpointError(f"the written {dst.name} has another header than {src.name}")
        for name, info in _ordered(table):
            lo, hi = (start + int(x) for x in info["data_offsets"])
            if name in replacements:
                if _read_exactly(fb, hi - lo, lo, dst.name) != _checked(src, info, name, replacements[name]):
                    raise CheckpointError(f"reading back {dst.name} gave a different {name} than was written")
                continue
            for edge in {(lo, min(hi, lo + EDGE)), (max(lo, hi - EDGE), hi)}:
                if _read_exactly(fb, edge[1] - edge[0], edge[0], dst.name) != _read_exactly(
                        fa, edge[1] - edge[0], edge[0], src.name):
                    raise CheckpointError(f"reading back {dst.name} gave a different {name} than {src.name} holds")


class Streamer:
    """Streams the shards, one after the other, in a background thread: the caller takes the
    wanted tensors from `tensors` (a queue; None after the last) and certifies while the
    thread copies (the copy waits on the disk, the certification on the CPU). The thread
    waits while more than `limit` bytes of tensors are held and the caller has tensors it has
    not taken yet, so memory stays bounded and the caller is never left waiting for a tensor
    the thread holds back."""

    def __init__(self, src: Path, dst: Path, shards: list[str], wanted: dict[str, set[str]], limit: int):
        self.src, self.dst, self.shards, self.wanted, self.limit = src, dst, shards, wanted, limit
        self.stop = threading.Event()
        self.room = threading.Condition()
        self.held = 0
        self.spare: dict[int, list[bytearray]] = {}  # read buffers given back, by size
        self.buffers: dict[int, bytearray] = {}  # id of each delivered tensor -> the bytearray it views
        self.reading: bytearray | None = None
        self.tensors: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="keybias-shards", daemon=True)
        self.thread.start()

    def _deliver(self, name: str, tensor: torch.Tensor) -> None:
        with self.room:
            while self.held > self.limit and self.tensors.qsize() and not self.stop.is_set():
                self.room.wait(0.1)
            self.held += tensor.numel() * tensor.element_size()
            self.buffers[id(tensor)] = self.reading
        self.tensors.put((name, tensor))

    def release(self, tensors: list[torch.Tensor]) -> None:
        """The caller is done with these tensors (and holds no view of them): their bytes no
        longer count, and their storage is read into again (fresh memory of tens of megabytes
        costs page faults about as long as the read)."""
        with self.room:
            for t in tensors:
                self.held -= t.numel() * t.element_size()
                data = self.buffers.pop(id(t), None)
                if data is not None:
                    self.spare.setdefault(len(data), []).append(data)
            self.room.notify_all()

    def _take(self, n: int) -> bytearray:
        with self.room:
            spare = self.spare.get(n)
            self.reading = spare.pop() if spare else bytearray(n)
            return self.reading

    def _run(self) -> None:
        try:
            for shard in self.shards:
                stream_shard(self.src / shard, self.dst / shard, self.wanted.get(shard, set()), self._deliver,
                             self.stop, self._take)
        except BaseException as exc:  # noqa: BLE001  (raised in the caller's thread by finish)
            self.error = exc
        finally:
            self.tensors.put(None)

    def finish(self) -> None:
        """Wait for the copies to end; the thread's error, if any, is raised here."""
        self.thread.join()
        if self.error is not None:
            raise self.error

    def abort(self) -> None:
        self.stop.set()
        with self.room:
            self.room.notify_all()
        self.thread.join()
