"""Tiny random models of every attention family the surgery tool decides on (notebook 05, tests).

Each builder makes a small model from a Hugging Face config or torch.nn constructor (no hub,
no download), seeded, with every bias set to random nonzero values: Hugging Face initializes
biases to zero, and a zero b_k would make any removal trivially exact. `model_inputs` gives
each family's inputs with padding (never a fully masked row), and `model_outputs` flattens
every floating output so that a whole-model change is one number.

Transformers 5 dropped BERT's relative position embeddings, so the relative_key and
relative_key_query cases use `RelativePositionSelfAttention`, a subclass of BertSelfAttention
that adds the score terms exactly as transformers 4 did (Shaw et al. 2018; Huang et al. 2020).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import nn

VOCAB, WIDTH, HEADS, FFN, SEQ, BATCH = 40, 16, 2, 32, 7, 2


def _offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import warnings

    # tqdm.auto warns about missing ipywidgets inside a notebook; there is no progress bar here
    warnings.filterwarnings("ignore", message="IProgress not found")
    import transformers

    # the tiny configs use small vocabularies; the config checks on special-token ids warn
    # about defaults these models never use
    transformers.utils.logging.set_verbosity_error()


@torch.no_grad()
def randomize_biases(model: nn.Module, seed: int, scale: float = 0.5) -> nn.Module:
    """Every bias-like parameter (name ending in 'bias', bias_k, bias_v) of an attention or
    projection layer gets seeded N(0, scale^2) entries; LayerNorm biases are left alone."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        leaf = name.rpartition(".")[2]
        if ("bias" in leaf) and "norm" not in name.lower():
            p.copy_((scale * torch.randn(p.shape, generator=gen, dtype=torch.float64)).to(p.dtype))
    return model


def _relative_self_attention():
    from transformers.models.bert.modeling_bert import BertSelfAttention

    class RelativePositionSelfAttention(BertSelfAttention):
        """BERT self-attention with transformers 4's relative position terms.

        relative_key adds q_i . r_(i-j) to score (i, j); relative_key_query also adds
        k_j . r_(i-j). Eager softmax attention, additive mask."""

        def __init__(self, config, position_embedding_type: str, max_distance: int = 16):
            super().__init__(config)
            self.position_embedding_type = position_embedding_type
            self.max_distance = max_distance
            self.distance_embedding = nn.Embedding(2 * max_distance - 1, self.attention_head_size)

        def forward(self, hidden_states, attention_mask=None, **kwargs):
            b, n, _ = hidden_states.shape
            shape = (b, n, self.num_attention_heads, self.attention_head_size)
            q = self.query(hidden_states).view(shape).transpose(1, 2)
            k = self.key(hidden_states).view(shape).transpose(1, 2)
            v = self.value(hidden_states).view(shape).transpose(1, 2)
            scores = q @ k.transpose(-1, -2)
            pos = torch.arange(n, device=hidden_states.device)
            r = self.distance_embedding((pos[:, None] - pos[None, :]) + self.max_distance - 1).to(q.dtype)
            scores = scores + torch.einsum("bhld,lrd->bhlr", q, r)
            if self.position_embedding_type == "relative_key_query":
                scores = scores + torch.einsum("bhrd,lrd->bhlr", k, r)
            scores = scores * self.scaling
            if attention_mask is not None:
                scores = scores + attention_mask
            probs = self.dropout(scores.softmax(-1))
            out = (probs @ v).transpose(1, 2).reshape(b, n, -1)
            return out, probs

    return RelativePositionSelfAttention


def _bert_relative(position_embedding_type: str) -> nn.Module:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=HEADS, intermediate_size=FFN,
                     vocab_size=VOCAB, max_position_embeddings=32, attn_implementation="eager")
    model = BertModel(cfg)
    cls = _relative_self_attention()
    for layer in model.encoder.layer:
        old = layer.attention.self
        new = cls(cfg, position_embedding_type)
        new.load_state_dict(old.state_dict(), strict=False)
        layer.attention.self = new
    return model


def _hf(config_name: str, model_name: str | None = None, **kw) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        cfg = getattr(transformers, config_name)(**kw)
        cls = getattr(transformers, model_name) if model_name else transformers.AutoModel
        return cls(cfg) if model_name else cls.from_config(cfg)
    return build


_TEXT = dict(hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=HEADS, intermediate_size=FFN,
             vocab_size=VOCAB, max_position_embeddings=40)
_IMAGE = dict(hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=HEADS, intermediate_size=FFN,
              image_size=8, patch_size=4, num_channels=3)
_SEQ2SEQ = dict(d_model=WIDTH, encoder_layers=1, decoder_layers=1, encoder_attention_heads=HEADS,
                decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, vocab_size=VOCAB,
                pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
_TOKENS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)

# family -> (what it is, builder, input kind, expected decision of strip_key_bias)
FAMILIES: dict[str, tuple[str, Callable[[], nn.Module], str, str]] = {
    "nn.MultiheadAttention": ("torch.nn.MultiheadAttention, packed in_proj",
                              lambda: nn.MultiheadAttention(WIDTH, HEADS, batch_first=True), "mha", "handled"),
    "nn.MultiheadAttention kdim/vdim": ("separate q/k/v weights (kdim=12, vdim=10), add_bias_kv",
                                        lambda: nn.MultiheadAttention(WIDTH, HEADS, kdim=12, vdim=10, add_bias_kv=True,
                                                                      batch_first=True), "mha", "handled"),
    "nn.TransformerEncoderLayer": ("torch encoder layer (self-attention MHA)",
                                   lambda: nn.TransformerEncoderLayer(WIDTH, HEADS, FFN, dropout=0.0, batch_first=True),
                                   "encoder", "handled"),
    "nn.TransformerDecoderLayer": ("torch decoder layer (self- and cross-attention MHA)",
                                   lambda: nn.TransformerDecoderLayer(WIDTH, HEADS, FFN, dropout=0.0, batch_first=True),
                                   "decoder", "handled"),
    "quantizable MHA": ("torch.ao.nn.quantizable.MultiheadAttention (linear_Q/K/V)",
                        lambda: torch.ao.nn.quantizable.MultiheadAttention(WIDTH, HEADS),
                        "mha", "handled"),
    "BERT": ("BertModel", _hf("BertConfig", **_TEXT), "text", "handled"),
    "RoBERTa": ("RobertaModel", _hf("RobertaConfig", **{**_TEXT, "pad_token_id": 1}), "text", "handled"),
    "DistilBERT": ("DistilBertModel", _hf("DistilBertConfig", dim=WIDTH, n_layers=2, n_heads=HEADS, hidden_dim=FFN,
                                          vocab_size=VOCAB, max_position_embeddings=40), "text", "handled"),
    "ELECTRA": ("ElectraModel", _hf("ElectraConfig", embedding_size=WIDTH, **_TEXT), "text", "handled"),
    "ViT": ("ViTModel", _hf("ViTConfig", **_IMAGE), "image", "handled"),
    "CLIP text": ("CLIPTextModel", _hf("CLIPTextConfig", **{**_TEXT, **_TOKENS}), "text", "handled"),
    "CLIP vision": ("CLIPVisionModel", _hf("CLIPVisionConfig", **_IMAGE), "image", "handled"),
    "BART": ("BartModel (encoder-decoder)", _hf("BartConfig", **_SEQ2SEQ, max_position_embeddings=40),
             "seq2seq", "handled"),
    "Whisper": ("WhisperModel (k_proj has no bias)", _hf("WhisperConfig", **_SEQ2SEQ, num_mel_bins=8,
                                                         max_source_positions=16, max_target_positions=16),
                "audio", "handled"),
    "GPT-2": ("GPT2Model (packed Conv1D c_attn)", _hf("GPT2Config", n_embd=WIDTH, n_layer=2, n_head=HEADS,
                                                    vocab_size=VOCAB, n_positions=40, **_TOKENS), "text", "handled"),
    "BERT relative_key": ("BERT-style, position term q . r only", lambda: _bert_relative("relative_key"),
                          "text", "handled"),
    "BERT relative_key_query": ("BERT-style, position terms q . r and k . r",
                                lambda: _bert_relative("relative_key_query"), "text", "refused"),
    "LLaMA attention_bias": ("LlamaModel with attention_bias=True (RoPE)",
                             _hf("LlamaConfig", hidden_size=WIDTH, num_hidden_layers=1, num_attention_heads=HEADS,
                                 num_key_value_heads=HEADS, intermediate_size=FFN, vocab_size=VOCAB,
                                 attention_bias=True, **_TOKENS), "text", "refused"),
    "Qwen2": ("Qwen2Model (RoPE, q/k/v biases)",
              _hf("Qwen2Config", hidden_size=WIDTH, num_hidden_layers=1, num_attention_heads=HEADS,
                  num_key_value_heads=HEADS, intermediate_size=FFN, vocab_size=VOCAB, **_TOKENS), "text", "refused"),
    "DeBERTa-v2": ("DebertaV2Model, relative attention with p2c and c2p",
                   _hf("DebertaV2Config", hidden_size=WIDTH, num_hidden_layers=1, num_attention_heads=HEADS,
                       intermediate_size=FFN, vocab_size=VOCAB, relative_attention=True, pos_att_type=["p2c", "c2p"],
                       max_relative_positions=8, position_buckets=4), "text", "refused"),
    "MHA add_zero_attn": ("nn.MultiheadAttention with add_zero_attn=True",
                          lambda: nn.MultiheadAttention(WIDTH, HEADS, add_zero_attn=True, batch_first=True),
                          "mha", "refused"),
}


def build(family: str, seed: int = 0) -> nn.Module:
    """The family's tiny model in float64 eval mode, weights seeded, biases random and nonzero."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {list(FAMILIES)}")
    _offline()
    torch.manual_seed(seed)
    model = FAMILIES[family][1]()
    return randomize_biases(model, seed + 1).double().eval()


def model_inputs(family: str, model: nn.Module, seed: int = 0) -> tuple[tuple, dict]:
    """(args, kwargs) for one forward of the family's model: padding on the second example's
    last positions (never every key of a row)."""
    gen = torch.Generator().manual_seed(seed)
    kind = FAMILIES[family][2]
    f64 = torch.float64
    if kind in ("mha", "encoder", "decoder"):
        kdim = getattr(model, "kdim", WIDTH)
        vdim = getattr(model, "vdim", WIDTH)
        x = torch.randn(BATCH, SEQ, WIDTH, generator=gen, dtype=f64)
        k = torch.randn(BATCH, SEQ, kdim, generator=gen, dtype=f64)
        v = torch.randn(BATCH, SEQ, vdim, generator=gen, dtype=f64)
        pad = torch.zeros(BATCH, SEQ, dtype=torch.bool)
        pad[1, -2:] = True
        if kind == "mha":
            if not model.batch_first:
                x, k, v = (t.transpose(0, 1) for t in (x, k, v))
            return (x, k, v), {"key_padding_mask": pad, "need_weights": False}
        if kind == "encoder":
            return (x,), {"src_key_padding_mask": pad}
        return (x, k), {"tgt_key_padding_mask": pad, "memory_key_padding_mask": pad}
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, -2:] = 0
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=gen)
    if kind == "text":
        return (), {"input_ids": ids, "attention_mask": mask}
    if kind == "image":
        return (), {"pixel_values": torch.randn(BATCH, 3, 8, 8, generator=gen, dtype=f64)}
    if kind == "seq2seq":
        return (), {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": ids[:, :4], "use_cache": False}
    if kind == "audio":
        return (), {"input_features": torch.randn(BATCH, 8, 32, generator=gen, dtype=f64),
                    "decoder_input_ids": ids[:, :4], "use_cache": False}
    raise ValueError(f"unknown input kind {kind!r}")


def model_outputs(model: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    """Every floating output tensor of one forward, flattened into one float64 vector."""
    with torch.no_grad():
        out = model(*args, **kwargs)
    leaves: list[torch.Tensor] = []

    def collect(obj) -> None:
        if isinstance(obj, torch.Tensor):
            if obj.is_floating_point():
                leaves.append(obj.detach().double().reshape(-1))
        elif isinstance(obj, (tuple, list)):
            for item in obj:
                collect(item)
        elif hasattr(obj, "to_tuple"):
            collect(obj.to_tuple())

    collect(out)
    if not leaves:
        raise ValueError(f"{type(model).__name__} returned no floating tensor")
    return torch.cat(leaves)
