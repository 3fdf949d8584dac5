"""What the key bias occupies: parameters, gradient and optimizer state, counted exactly.

Per attention layer of width E the key bias b_k has E parameters; it carries E gradient
entries while training, and the optimizer keeps `OPTIMIZER_STATES[name]` more tensors of E
entries (Adam 2, SGD with momentum 1). Whole-model counts for reference architectures come
from closed formulas (`architecture_params`) that `check_architectures` compares with real
modules (transformers models built on the meta device, and `nn.TransformerEncoderLayer`).
"""

from __future__ import annotations

import os
import warnings

import pandas as pd
import torch
from torch import nn

from keybias.studies.params import check_choice, check_positive_int

# Widths whose nn.MultiheadAttention layer counts are checked (include the architectures' widths).
LAYER_WIDTHS = (64, 128, 256, 512, 768, 1024, 1280, 1600, 2048)
OPTIMIZER_STATES = {"sgd": 0, "sgd_momentum": 1, "adam": 2}

# Reference architectures from their published standard dimensions.
ARCHITECTURES = {
    "BERT-base": dict(family="bert", embed_dim=768, layers=12, heads=12, ffn=3072, vocab=30522, positions=512, type_vocab=2),
    "BERT-large": dict(family="bert", embed_dim=1024, layers=24, heads=16, ffn=4096, vocab=30522, positions=512, type_vocab=2),
    "ViT-B/16": dict(family="vit", embed_dim=768, layers=12, heads=12, ffn=3072, image=224, patch=16, channels=3),
    "ViT-L/16": dict(family="vit", embed_dim=1024, layers=24, heads=16, ffn=4096, image=224, patch=16, channels=3),
    "GPT-2 small": dict(family="gpt2", embed_dim=768, layers=12, heads=12, ffn=3072, vocab=50257, positions=1024),
    "GPT-2 medium": dict(family="gpt2", embed_dim=1024, layers=24, heads=16, ffn=4096, vocab=50257, positions=1024),
    "GPT-2 large": dict(family="gpt2", embed_dim=1280, layers=36, heads=20, ffn=5120, vocab=50257, positions=1024),
    "GPT-2 XL": dict(family="gpt2", embed_dim=1600, layers=48, heads=25, ffn=6400, vocab=50257, positions=1024),
}


def make_optimizer(params, optimizer: str):
    """The optimizer of a timed training step (learning rate irrelevant to cost)."""
    check_choice("optimizer", optimizer, ("adam", "sgd_momentum"))
    if optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    return torch.optim.SGD(params, lr=1e-4, momentum=0.9)


def mha_param_count(embed_dim: int, *, bias: bool = True) -> int:
    """Parameters of nn.MultiheadAttention(embed_dim, h, bias=bias): 4E^2 (+ 4E biases)."""
    check_positive_int("embed_dim", embed_dim)
    return 4 * embed_dim**2 + (4 * embed_dim if bias else 0)


def encoder_layer_param_count(embed_dim: int, ffn: int) -> int:
    """One post/pre-norm encoder block: attention, two-layer MLP, two LayerNorms."""
    return mha_param_count(embed_dim) + (2 * embed_dim * ffn + ffn + embed_dim) + 4 * embed_dim


def architecture_params(name: str) -> dict:
    """Closed-form parameter counts of a reference architecture (transformers' layout:
    BertModel and ViTModel with pooler, GPT2Model without LM head)."""
    check_choice("architecture", name, ARCHITECTURES)
    a = ARCHITECTURES[name]
    e, n = a["embed_dim"], a["layers"]
    blocks = n * encoder_layer_param_count(e, a["ffn"])
    if a["family"] == "bert":
        embed = (a["vocab"] + a["positions"] + a["type_vocab"]) * e + 2 * e
        head = e * e + e  # pooler
    elif a["family"] == "vit":
        patches = (a["image"] // a["patch"]) ** 2
        embed = a["channels"] * a["patch"] ** 2 * e + e + e + (patches + 1) * e  # conv, cls, positions
        head = 2 * e + e * e + e  # final LayerNorm and pooler
    else:
        embed = (a["vocab"] + a["positions"]) * e
        head = 2 * e  # final LayerNorm
    return {
        "architecture": name,
        "embed_dim": e,
        "layers": n,
        "attention_layer_params": mha_param_count(e),
        "model_params": embed + blocks + head,
        "bk_params": n * e,
    }


def memory_table(optimizer_states: dict | None = None, bytes_per_value: int = 4) -> pd.DataFrame:
    """What b_k occupies per architecture: parameters, gradient, optimizer state, bytes
    and fractions of one attention layer and of the whole model."""
    states = OPTIMIZER_STATES if optimizer_states is None else optimizer_states
    rows = []
    for name in ARCHITECTURES:
        r = architecture_params(name)
        bk = r["bk_params"]
        rows.append({
            **r,
            "bk_grad": bk,
            "bk_adam_state": states["adam"] * bk,
            "bk_sgd_momentum_state": states["sgd_momentum"] * bk,
            "bk_training_adam_bytes": (2 + states["adam"]) * bk * bytes_per_value,
            "model_training_adam_bytes": (2 + states["adam"]) * r["model_params"] * bytes_per_value,
            "bk_fraction_of_attention_layer": r["embed_dim"] / r["attention_layer_params"],
            "bk_fraction_of_model": bk / r["model_params"],
        })
    return pd.DataFrame(rows)


def per_layer_memory(embed_dims, num_heads: int | None = None) -> pd.DataFrame:
    """b_k counted in real nn.MultiheadAttention modules against the formula."""
    rows = []
    for e in embed_dims:
        check_positive_int("embed_dim", e)
        h = num_heads or 1
        mha = nn.MultiheadAttention(e, h, bias=True, device="meta")
        real_total = sum(p.numel() for p in mha.parameters())
        real_bk = mha.in_proj_bias[e : 2 * e].numel()
        rows.append({
            "embed_dim": e,
            "layer_params_module": real_total,
            "layer_params_formula": mha_param_count(e),
            "bk_params_module": real_bk,
            "bk_params_formula": e,
            "bk_fraction_of_layer": e / real_total,
            "match": real_total == mha_param_count(e) and real_bk == e,
        })
    return pd.DataFrame(rows)


def _hf_model(name: str):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    with warnings.catch_warnings():
        # transformers imports tqdm.auto, which warns in a kernel without ipywidgets; no bar is drawn here
        warnings.filterwarnings("ignore", message="IProgress not found")
        import transformers

    a = ARCHITECTURES[name]
    with torch.device("meta"):
        if a["family"] == "bert":
            cfg = transformers.BertConfig(
                vocab_size=a["vocab"], hidden_size=a["embed_dim"], num_hidden_layers=a["layers"],
                num_attention_heads=a["heads"], intermediate_size=a["ffn"],
                max_position_embeddings=a["positions"], type_vocab_size=a["type_vocab"])
            return transformers.BertModel(cfg)
        if a["family"] == "vit":
            cfg = transformers.ViTConfig(
                hidden_size=a["embed_dim"], num_hidden_layers=a["layers"], num_attention_heads=a["heads"],
                intermediate_size=a["ffn"], image_size=a["image"], patch_size=a["patch"],
                num_channels=a["channels"])
            return transformers.ViTModel(cfg)
        cfg = transformers.GPT2Config(
            vocab_size=a["vocab"], n_embd=a["embed_dim"], n_layer=a["layers"], n_head=a["heads"],
            n_positions=a["positions"])
        return transformers.GPT2Model(cfg)


def real_key_bias_count(model, family: str) -> int:
    """Entries of the key bias in a transformers model (GPT-2 packs it in c_attn.bias[E:2E])."""
    total = 0
    for name, p in model.named_parameters():
        if family in ("bert", "vit") and name.endswith(("attention.self.key.bias", "attention.key.bias", "attention.k_proj.bias")):
            total += p.numel()
        elif family == "gpt2" and name.endswith("attn.c_attn.bias"):
            total += p.numel() // 3
    return total


def _torch_model(name: str) -> tuple[nn.Module, int]:
    """The architecture assembled from torch.nn modules on the meta device: one real
    TransformerEncoderLayer block (returned with the number of times it repeats) plus the
    real embedding and head modules; an independent count of the same layout."""
    a = ARCHITECTURES[name]
    e = a["embed_dim"]
    with torch.device("meta"):
        block = nn.TransformerEncoderLayer(e, a["heads"], a["ffn"], batch_first=True)
        if a["family"] == "bert":
            parts = [nn.Embedding(a["vocab"], e), nn.Embedding(a["positions"], e), nn.Embedding(a["type_vocab"], e),
                     nn.LayerNorm(e), nn.Linear(e, e)]
        elif a["family"] == "vit":
            patches = (a["image"] // a["patch"]) ** 2
            tokens = nn.ParameterList([nn.Parameter(torch.empty(1, 1, e)), nn.Parameter(torch.empty(1, patches + 1, e))])
            parts = [nn.Conv2d(a["channels"], e, a["patch"], stride=a["patch"]), tokens, nn.LayerNorm(e), nn.Linear(e, e)]
        else:
            parts = [nn.Embedding(a["vocab"], e), nn.Embedding(a["positions"], e), nn.LayerNorm(e)]
        return nn.ModuleDict({"block": block, "rest": nn.ModuleList(parts)}), a["layers"]


def _torch_key_bias_count(model: nn.Module) -> int:
    return sum(m.in_proj_bias[m.embed_dim : 2 * m.embed_dim].numel()
               for m in model.modules() if isinstance(m, nn.MultiheadAttention) and m.in_proj_bias is not None)


def check_architectures(names=None, using: str = "transformers") -> pd.DataFrame:
    """Build each architecture on the meta device (no weights, no download) and compare
    its parameter count and key-bias count with `architecture_params`.

    using="transformers": BertModel, ViTModel, GPT2Model from standard configs.
    using="torch": the layout assembled from torch.nn blocks (faster, no transformers import).
    """
    check_choice("architecture_check", using, ("transformers", "torch"))
    rows = []
    for name in names or ARCHITECTURES:
        formula = architecture_params(name)
        if using == "transformers":
            model = _hf_model(name)
            real_bk = real_key_bias_count(model, ARCHITECTURES[name]["family"])
            real = sum(p.numel() for p in model.parameters())
        else:
            model, layers = _torch_model(name)
            real_bk = layers * _torch_key_bias_count(model["block"])
            real = layers * sum(p.numel() for p in model["block"].parameters()) + sum(
                p.numel() for p in model["rest"].parameters())
        rows.append({
            "architecture": name,
            "checked_with": using,
            "model_params_formula": formula["model_params"],
            "model_params_module": real,
            "bk_params_formula": formula["bk_params"],
            "bk_params_module": real_bk,
            "match": real == formula["model_params"] and real_bk == formula["bk_params"],
        })
        del model
    return pd.DataFrame(rows)


def allocator_check(embed_dim: int = 1024, optimizer: str = "adam", device: str = "cuda") -> dict:
    """Bytes that b_k's parameter, gradient and optimizer state really occupy on a GPU,
    from torch.cuda.memory_allocated / max_memory_allocated, against 4*E*(2 + #state).

    Needs a CUDA device; elsewhere returns a row with status "not run" and the reason.
    """
    check_positive_int("embed_dim", embed_dim)
    check_choice("optimizer", optimizer, ("adam", "sgd_momentum"))
    expected = 4 * embed_dim * (2 + OPTIMIZER_STATES[optimizer])
    row = {"device": "cuda", "embed_dim": embed_dim, "optimizer": optimizer, "expected_bytes": expected}
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        why = "no CUDA GPU on this machine" if not torch.cuda.is_available() else f"this run used device={device}"
        return {**row, "measured_bytes": None, "peak_bytes": None, "match": None, "status": "not run", "reason": why}
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    p = nn.Parameter(torch.zeros(embed_dim, device=device))
    opt = make_optimizer([p], optimizer)
    p.grad = torch.ones_like(p)
    opt.step()
    torch.cuda.synchronize()
    measured = torch.cuda.memory_allocated() - before  # Adam's step counter lives on the CPU
    peak = torch.cuda.max_memory_allocated() - before
    del opt, p
    return {**row, "measured_bytes": measured, "peak_bytes": peak, "match": measured == expected,
            "status": "measured", "reason": torch.cuda.get_device_name(0)}


