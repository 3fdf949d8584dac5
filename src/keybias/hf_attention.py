"""Attention as Hugging Face transformers implements it, on tiny random models (no download).

Each model is built from a small config (1 layer, hidden 16, 2 heads) with random weights and
nonzero random biases. We perturb the key bias of the first attention module and compare that
module's output (captured by a forward hook), exactly as keybias.studies.invariance.measure does for PyTorch modules.

- BERT, RoBERTa, ViT: separate query/key/value Linear layers with bias; plain softmax attention,
  so b_k is redundant.
- GPT-2: one fused Conv1D c_attn whose bias holds [b_q, b_k, b_v]; causal softmax, redundant.
- Whisper: k_proj has no bias (Whisper drops it). We attach one (random values) to show that
  the drop is exact: a b_k there would be redundant.
- Qwen2: q/k/v biases followed by rotary embeddings; the rotation acts on b_k per position,
  so b_k is NOT redundant there (assumption A3 of keybias.variants).
"""

from __future__ import annotations

import os

import torch
from torch import nn

MODELS = ("bert", "roberta", "gpt2", "vit", "whisper", "qwen2")
EXPECTED = {
    "bert": ("redundant", "plain softmax attention; every key goes through the biased key Linear"),
    "roberta": ("redundant", "plain softmax attention; every key goes through the biased key Linear"),
    "gpt2": ("redundant", "causal softmax; the fused c_attn bias shifts every key by the same b_k"),
    "vit": ("redundant", "plain softmax attention; every key goes through the biased key Linear"),
    "whisper": ("redundant", "Whisper ships without b_k; an added b_k is redundant, so dropping it is exact"),
    "qwen2": ("not_redundant", "(A3) rotary embeddings rotate b_k per position after the bias"),
}
HIDDEN, HEADS = 16, 2
# eager attention of these computes softmax(..., dtype=torch.float32) whatever the model dtype
SOFTMAX_FLOAT32 = ("vit", "qwen2")


def _check(name: str) -> None:
    if name not in MODELS:
        raise ValueError(f"hf model {name!r} unknown; allowed: {list(MODELS)}")


def build_model(name: str, *, attn_implementation: str = "eager", seed: int = 0):
    """(model, attention module, inputs) in float64 for a tiny random `name`; offline only."""
    _check(name)
    if attn_implementation not in ("eager", "sdpa"):
        raise ValueError(f"attn_implementation {attn_implementation!r}; allowed: ['eager', 'sdpa']")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import transformers as T
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    common = {"attn_implementation": attn_implementation}
    drop = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    b, n = 2, 6
    ids = torch.randint(3, 50, (b, n), generator=gen)
    if name in ("bert", "roberta"):
        cls = T.BertModel if name == "bert" else T.RobertaModel
        ccls = T.BertConfig if name == "bert" else T.RobertaConfig
        cfg = ccls(hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=HEADS,
                   intermediate_size=32, vocab_size=50, pad_token_id=1, **drop, **common)
        model = cls(cfg)
        att = model.encoder.layer[0].attention.self
        inputs = {"input_ids": ids}
    elif name == "gpt2":
        cfg = T.GPT2Config(n_embd=HIDDEN, n_layer=1, n_head=HEADS, vocab_size=50, bos_token_id=0,
                           eos_token_id=0, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                           attn_pdrop=0.0, **common)
        model = T.GPT2Model(cfg)
        att = model.h[0].attn
        inputs = {"input_ids": ids}
    elif name == "vit":
        cfg = T.ViTConfig(hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=HEADS,
                          intermediate_size=32, image_size=8, patch_size=4, **drop, **common)
        model = T.ViTModel(cfg)
        att = model.layers[0].attention if hasattr(model, "layers") else model.encoder.layer[0].attention.attention
        inputs = {"pixel_values": torch.randn(b, 3, 8, 8, generator=gen, dtype=torch.float64)}
    elif name == "whisper":
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        cfg = T.WhisperConfig(d_model=HIDDEN, encoder_layers=1, decoder_layers=1,
                              encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                              num_mel_bins=8, max_source_positions=8, vocab_size=50,
                              encoder_ffn_dim=32, decoder_ffn_dim=32, pad_token_id=0,
                              bos_token_id=0, eos_token_id=0, decoder_start_token_id=0,
                              dropout=0.0, attention_dropout=0.0, **common)
        model = WhisperEncoder(cfg)
        att = model.layers[0].self_attn
        old = att.k_proj
        att.k_proj = nn.Linear(old.in_features, old.out_features, bias=True)
        with torch.no_grad():
            att.k_proj.weight.copy_(old.weight)
        inputs = {"input_features": torch.randn(b, 8, 16, generator=gen, dtype=torch.float64)}
    else:
        cfg = T.Qwen2Config(hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=HEADS,
                            num_key_value_heads=HEADS, intermediate_size=32, vocab_size=50,
                            attention_dropout=0.0, **common)
        model = T.Qwen2Model(cfg)
        att = model.layers[0].self_attn
        inputs = {"input_ids": ids}
    model = model.double().eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5)
    return model, att, inputs


def _qkv_modules(att):
    """(q, k, v, o) submodules; GPT-2's fused c_attn is returned as q with k = v = None."""
    if hasattr(att, "c_attn"):
        return att.c_attn, None, None, att.c_proj
    for names in (("query", "key", "value", None), ("q_proj", "k_proj", "v_proj", "o_proj")):
        if hasattr(att, names[0]):
            o = getattr(att, names[3], None) if names[3] else None
            o = o if o is not None else getattr(att, "out_proj", None)
            return getattr(att, names[0]), getattr(att, names[1]), getattr(att, names[2]), o
    raise ValueError(f"cannot find q/k/v projections in {type(att).__name__}")


def bias_roles(att) -> dict:
    q, k, v, _ = _qkv_modules(att)
    if k is None:  # GPT-2 fused
        bq, bk, bv = q.bias.data.chunk(3)
        return {"b_q": [bq], "b_k": [bk], "b_v": [bv]}
    return {"b_q": [q.bias.data], "b_k": [k.bias.data], "b_v": [v.bias.data]}


def qk_scale_views(att):
    """(query-side, key-side) weight and bias views; rescaling them oppositely keeps every score."""
    q, k, _, _ = _qkv_modules(att)
    if k is None:  # GPT-2's Conv1D: weight [in, 3E], columns [q | k | v]
        e = q.weight.shape[1] // 3
        return [q.weight.data[:, :e], q.bias.data[:e]], [q.weight.data[:, e:2 * e], q.bias.data[e:2 * e]]
    q_side = [q.weight.data] + ([q.bias.data] if q.bias is not None else [])
    k_side = [k.weight.data] + ([k.bias.data] if k.bias is not None else [])
    return q_side, k_side


def bias_grads(att):
    q, k, v, _ = _qkv_modules(att)
    if k is None:
        return None if q.bias.grad is None else q.bias.grad.chunk(3)
    gs = [m.bias.grad for m in (q, k, v)]
    return None if any(g is None for g in gs) else gs


def hf_case(cfg: dict) -> dict:
    """A keybias.studies.invariance.measure case for a Hugging Face model family (cfg['variant'] is the model name)."""
    name, impl = cfg["variant"], cfg["hf_attn_implementation"] or "eager"
    _check(name)
    dev = cfg["device"]

    def build(dtype):
        model, att, inputs = build_model(name, attn_implementation=impl, seed=cfg["seed"])
        model = model.to(dev, dtype)
        inputs = {k: (v.to(dev, dtype) if v.is_floating_point() else v.to(dev)) for k, v in inputs.items()}
        model._kb_att = att
        return model, inputs

    def run(model, inputs):
        captured = {}

        def hook(module, args, out):
            captured.setdefault("out", out[0] if isinstance(out, tuple) else out)

        handle = model._kb_att.register_forward_hook(hook)
        try:
            model(**inputs)
        finally:
            handle.remove()
        return captured["out"]

    def stats(model, inputs):
        q_m, k_m, v_m, o_m = _qkv_modules(model._kb_att)
        outs = {}
        hooks = [m.register_forward_hook(lambda mod, a, o, key=key: outs.setdefault(key, o))
                 for key, m in (("q", q_m), ("k", k_m), ("v", v_m)) if m is not None]
        try:
            run(model, inputs)
        finally:
            for h in hooks:
                h.remove()
        if k_m is None:
            q, k, v = outs["q"].double().chunk(3, dim=-1)
        else:
            q, k, v = (outs[x].double() for x in ("q", "k", "v"))
        w_o = None  # the output projection, when it is part of the hooked module
        if o_m is not None:
            w_o = o_m.weight.double().T if name == "gpt2" else o_m.weight.double()
        return q, k, v, w_o, k.shape[1]

    return {"build": build, "run": run, "stats": stats,
            "working_dtype": "float32" if name in SOFTMAX_FLOAT32 and impl == "eager" else None,
            "roles": lambda model: bias_roles(model._kb_att),
            "qk_scale": lambda model: qk_scale_views(model._kb_att),
            "grads": lambda model: bias_grads(model._kb_att)}
