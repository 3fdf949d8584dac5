"""What the key bias costs: parameters, optimizer memory and time.

Memory is counted exactly. Per attention layer of width E the key bias b_k has E
parameters; it carries E gradient entries while training, and the optimizer keeps
`OPTIMIZER_STATES[name]` more tensors of E entries (Adam 2, SGD with momentum 1).
Whole-model counts for reference architectures come from closed formulas
(`architecture_params`) that `check_architectures` compares with real modules
(transformers models built on the meta device, and `nn.TransformerEncoderLayer`).

Time is measured with explicit attention implementations that differ only in the work
they do (`IMPLEMENTATIONS`):

    explicit          q = x W_q^T + b_q,  k = x W_k^T + b_k,  v = x W_v^T + b_v  (A)
    explicit_no_bk    k = x W_k^T  (F.linear without bias: mm instead of addmm)    (B)
    explicit_control  a second, identical copy of A (the noise control)
    explicit_no_bias  no projection biases at all (lower bound)                    (C)
    mha               torch.nn.MultiheadAttention(bias=True) as it is
    mha_no_bias       torch.nn.MultiheadAttention(bias=False)

B computes exactly A with b_k = 0 (softmax is shift invariant, so also A itself up to
rounding). The operations that disappear in B: in the forward pass the broadcast of b_k
into the key projection output (addmm -> mm: B*S*E values written and read again); in the
backward pass the reduction of grad_k over batch and sequence for grad b_k (B*S*E values
read, one kernel); in the optimizer step the update of one parameter of E entries
(Adam: param, grad and two state tensors touched); and the zeroing of its gradient.

Steps are timed interleaved: after a warm-up, each repetition runs every implementation
once, in a fresh random order, so drifts in machine load hit all of them alike. The
median per-step time is reported per implementation; a ratio B/A is the median over
repetitions of the paired ratios B_r/A_r (also the ratio of medians, for reference), with
a 95% percentile bootstrap interval (repetitions resampled, numpy Generator, fixed seed).
Timings are machine-specific (see `MACHINE_SPECIFIC_OUTPUTS`).

Command line (`make bench`): ``python -m keybias.cost --full --device cpu --out results/data``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from keybias.export import format_number
from keybias.params import Param

PARAMETERS = {
    "embed_dims": Param(int, many=True, positive=True, help="embed_dim values swept (others at base)"),
    "seq_lens": Param(int, many=True, positive=True, help="sequence lengths swept (others at base)"),
    "batch_sizes": Param(int, many=True, positive=True, help="batch sizes swept (others at base)"),
    "base_embed_dim": Param(int, positive=True, help="embed_dim while another axis is swept"),
    "base_seq_len": Param(int, positive=True, help="sequence length while another axis is swept"),
    "base_batch": Param(int, positive=True, help="batch size while another axis is swept"),
    "head_dim": Param(int, positive=True, help="per-head width; num_heads = embed_dim // head_dim"),
    "attentions": Param(str, many=True, choices=("self", "cross"), help="self (packed) or cross attention"),
    "passes": Param(str, many=True, choices=("inference", "training"), help="timed passes"),
    "reps": Param(int, minimum=30, help="interleaved repetitions per configuration"),
    "warmup": Param(int, minimum=1, help="warm-up steps per implementation"),
    "min_rep_seconds": Param(float, minimum=0.0, help="each repetition loops a step until this long"),
    "threads": Param(int, positive=True, help="torch.set_num_threads value (pinned, recorded)"),
    "clock": Param(str, choices=("process", "wall"), help="process CPU time (robust to a shared machine) or wall time"),
    "optimizer": Param(str, choices=("adam", "sgd_momentum"), help="optimizer of the training step"),
    "n_boot": Param(int, minimum=200, help="bootstrap resamples for the ratio CI"),
    "seed": Param(int, minimum=0, help="seed of weights, inputs, order and bootstrap"),
    "architecture_check": Param(str, choices=("transformers", "torch"),
                                help="real modules the counts are checked against (transformers models, or torch.nn blocks)"),
}

# Outputs whose values depend on the machine (timings); verification against committed
# results must skip them. Paths relative to results/.
MACHINE_SPECIFIC_OUTPUTS = [
    "data/cost_timing*.csv",
    "data/cost_bench*.csv",
    "data/cost_bench*.json",
    "figures/cost_time_ratio.pdf",
    "figures/cost_time_ratio.png",
    "tables/cost_timing*.tex",
    "macros/06_cost.tex",  # mixes exact memory counts with timing numbers
    "steps/06_cost.json",  # timing claims carry measured values
]

# Widths whose nn.MultiheadAttention layer counts are checked (include the architectures' widths).
LAYER_WIDTHS = (64, 128, 256, 512, 768, 1024, 1280, 1600, 2048)
# Confidence level of every bootstrap interval; chance rates below derive from it.
LEVEL = 0.95
# Tail probability below which a count of interval misses is no longer put down to chance.
CHANCE_TAIL = 1e-3
OPTIMIZER_STATES = {"sgd": 0, "sgd_momentum": 1, "adam": 2}
IMPLEMENTATIONS = ("explicit", "explicit_no_bk", "explicit_control", "explicit_no_bias", "mha", "mha_no_bias")
# ratio name -> (numerator, denominator)
RATIOS = {
    "no_bk": ("explicit_no_bk", "explicit"),
    "control": ("explicit_control", "explicit"),
    "no_bias_explicit": ("explicit_no_bias", "explicit"),
    "no_bias_mha": ("mha_no_bias", "mha"),
    "explicit_vs_mha": ("explicit", "mha"),
}
ATTENTIONS = ("self", "cross")
PASSES = ("inference", "training")
CLOCKS = {"process": time.process_time, "wall": time.perf_counter}
PHASES = {"inference": ("forward",), "training": ("forward", "backward", "step", "total")}

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


def _choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; allowed: {list(allowed)}")


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


# --------------------------------------------------------------------------- memory


def mha_param_count(embed_dim: int, *, bias: bool = True) -> int:
    """Parameters of nn.MultiheadAttention(embed_dim, h, bias=bias): 4E^2 (+ 4E biases)."""
    _positive("embed_dim", embed_dim)
    return 4 * embed_dim**2 + (4 * embed_dim if bias else 0)


def encoder_layer_param_count(embed_dim: int, ffn: int) -> int:
    """One post/pre-norm encoder block: attention, two-layer MLP, two LayerNorms."""
    return mha_param_count(embed_dim) + (2 * embed_dim * ffn + ffn + embed_dim) + 4 * embed_dim


def architecture_params(name: str) -> dict:
    """Closed-form parameter counts of a reference architecture (transformers' layout:
    BertModel and ViTModel with pooler, GPT2Model without LM head)."""
    _choice("architecture", name, ARCHITECTURES)
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
        _positive("embed_dim", e)
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
    import os as _os

    _os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
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
    _choice("architecture_check", using, ("transformers", "torch"))
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
    _positive("embed_dim", embed_dim)
    _choice("optimizer", optimizer, ("adam", "sgd_momentum"))
    expected = 4 * embed_dim * (2 + OPTIMIZER_STATES[optimizer])
    row = {"device": "cuda", "embed_dim": embed_dim, "optimizer": optimizer, "expected_bytes": expected}
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        why = "no CUDA GPU on this machine" if not torch.cuda.is_available() else f"this run used device={device}"
        return {**row, "measured_bytes": None, "peak_bytes": None, "match": None, "status": "not run", "reason": why}
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    p = nn.Parameter(torch.zeros(embed_dim, device=device))
    opt = _make_optimizer([p], optimizer)
    p.grad = torch.ones_like(p)
    opt.step()
    torch.cuda.synchronize()
    measured = torch.cuda.memory_allocated() - before  # Adam's step counter lives on the CPU
    peak = torch.cuda.max_memory_allocated() - before
    del opt, p
    return {**row, "measured_bytes": measured, "peak_bytes": peak, "match": measured == expected,
            "status": "measured", "reason": torch.cuda.get_device_name(0)}


# --------------------------------------------------------------------------- implementations


def explicit_params(mha: nn.MultiheadAttention, *, key_bias: bool = True, bias: bool = True) -> dict:
    """Separate q/k/v/o projection parameters copied from an nn.MultiheadAttention.

    key_bias=False drops b_k entirely (not zeroed: absent, so no add, no gradient, no update).
    The result equals the module with b_k = 0 exactly, and the module itself up to rounding,
    because softmax(s + c 1^T) = softmax(s) row-wise and q . b_k is constant along each row.
    """
    e = mha.embed_dim
    w = mha.in_proj_weight.detach()
    p = {"w_q": w[:e], "w_k": w[e : 2 * e], "w_v": w[2 * e :], "w_o": mha.out_proj.weight.detach()}
    if bias and mha.in_proj_bias is not None:
        b = mha.in_proj_bias.detach()
        p.update(b_q=b[:e], b_v=b[2 * e :], b_o=mha.out_proj.bias.detach())
        if key_bias:
            p["b_k"] = b[e : 2 * e]
    return {k: nn.Parameter(v.clone()) for k, v in p.items()}


def explicit_attention(params: dict, query, key, value, num_heads: int):
    """Multi-head attention (batch_first) from separate projections; a missing bias is skipped."""
    q = F.linear(query, params["w_q"], params.get("b_q"))
    k = F.linear(key, params["w_k"], params.get("b_k"))
    v = F.linear(value, params["w_v"], params.get("b_v"))
    b, n, e = q.shape
    s = k.shape[1]
    d = e // num_heads
    q = q.view(b, n, num_heads, d).transpose(1, 2)
    k = k.view(b, s, num_heads, d).transpose(1, 2)
    v = v.view(b, s, num_heads, d).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v)
    o = o.transpose(1, 2).reshape(b, n, e)
    return F.linear(o, params["w_o"], params.get("b_o"))


def _explicit_forward(params: dict, num_heads: int):
    return lambda q, k, v: explicit_attention(params, q, k, v, num_heads)


def _module_forward(module: nn.MultiheadAttention):
    return lambda q, k, v: module(q, k, v, need_weights=False)[0]


def build_implementations(embed_dim: int, num_heads: int, *, seed: int = 0, device="cpu", dtype=torch.float32) -> dict:
    """name -> (parameters list, forward(query, key, value), module or None); all share weights' values."""
    _positive("embed_dim", embed_dim)
    _positive("num_heads", num_heads)
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}")
    torch.manual_seed(seed)
    mha = nn.MultiheadAttention(embed_dim, num_heads, bias=True, batch_first=True, device=device, dtype=dtype)
    with torch.no_grad():  # nonzero biases, so b_k really is there
        mha.in_proj_bias.normal_(0, 0.1)
        mha.out_proj.bias.normal_(0, 0.1)
    mha_nb = nn.MultiheadAttention(embed_dim, num_heads, bias=False, batch_first=True, device=device, dtype=dtype)
    with torch.no_grad():
        mha_nb.in_proj_weight.copy_(mha.in_proj_weight)
        mha_nb.out_proj.weight.copy_(mha.out_proj.weight)
    out = {}
    for name, kw in (
        ("explicit", {}),
        ("explicit_no_bk", {"key_bias": False}),
        ("explicit_control", {}),
        ("explicit_no_bias", {"bias": False}),
    ):
        p = explicit_params(mha, **kw)
        out[name] = (list(p.values()), _explicit_forward(p, num_heads), None)
    for name, m in (("mha", mha), ("mha_no_bias", mha_nb)):
        out[name] = (list(m.parameters()), _module_forward(m), m)
    return out


# --------------------------------------------------------------------------- timing


def _sync(device) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _make_optimizer(params, optimizer: str):
    if optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    return torch.optim.SGD(params, lr=1e-4, momentum=0.9)


def time_config(
    *,
    embed_dim: int,
    seq_len: int,
    batch: int,
    attention: str,
    mode: str,
    head_dim: int = 64,
    reps: int = 30,
    warmup: int = 2,
    min_rep_seconds: float = 0.0,
    optimizer: str = "adam",
    seed: int = 0,
    device="cpu",
    clock: str = "process",
    implementations=IMPLEMENTATIONS,
) -> pd.DataFrame:
    """Interleaved timing of every implementation at one configuration.

    Returns one row per (rep, implementation, phase) with seconds per step. Each
    repetition loops the step `inner` times (calibrated in warm-up so a repetition lasts
    at least `min_rep_seconds`) and divides.

    clock="process" reads the CPU time of this process (all its threads): time the process
    spends descheduled because other programs share the cores does not count, which makes
    ratios robust on a busy machine (cache and memory-bandwidth interference still do).
    With several threads it sums their CPU time (OpenMP spin-waits included), so absolute
    times exceed wall time while ratios stay comparable.
    clock="wall" reads perf_counter; use it on GPUs (process CPU time would miss GPU work).
    """
    for n, v in (("embed_dim", embed_dim), ("seq_len", seq_len), ("batch", batch), ("head_dim", head_dim), ("reps", reps), ("warmup", warmup)):
        _positive(n, v)
    _choice("attention", attention, ATTENTIONS)
    _choice("mode", mode, PASSES)
    _choice("optimizer", optimizer, ("adam", "sgd_momentum"))
    _choice("clock", clock, CLOCKS)
    if clock == "process" and str(device).startswith("cuda"):
        raise ValueError("clock='process' cannot see GPU work; use clock='wall' on cuda")
    now = CLOCKS[clock]
    for name in implementations:
        _choice("implementation", name, IMPLEMENTATIONS)
    num_heads = max(1, embed_dim // head_dim)
    impls = build_implementations(embed_dim, num_heads, seed=seed, device=device)
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    x = torch.randn(batch, seq_len, embed_dim, generator=g).to(device)
    mem = torch.randn(batch, seq_len, embed_dim, generator=g).to(device) if attention == "cross" else x
    upstream = torch.randn(batch, seq_len, embed_dim, generator=g).to(device)

    steps = {}
    for name in implementations:
        params, fwd, module = impls[name]
        if mode == "inference":
            if module is not None:
                module.eval()

            def step(fwd=fwd):
                t0 = now()
                with torch.no_grad():
                    fwd(x, mem, mem)
                _sync(device)
                return (now() - t0,)
        else:
            if module is not None:
                module.train()
            opt = _make_optimizer(params, optimizer)

            def step(fwd=fwd, opt=opt):
                t0 = now()
                y = fwd(x, mem, mem)
                loss = (y * upstream).sum()
                _sync(device)
                t1 = now()
                loss.backward()
                _sync(device)
                t2 = now()
                opt.step()
                opt.zero_grad(set_to_none=True)
                _sync(device)
                t3 = now()
                return (t1 - t0, t2 - t1, t3 - t2, t3 - t0)
        steps[name] = step

    slowest = 0.0
    for name in implementations:
        for _ in range(warmup):
            t = steps[name]()
        slowest = max(slowest, t[-1])
    inner = max(1, math.ceil(min_rep_seconds / max(slowest, 1e-9)))
    phases = PHASES[mode]
    rng = np.random.default_rng(seed)
    rows = []
    for rep in range(reps):
        order = rng.permutation(len(implementations))
        for pos, i in enumerate(order):
            name = implementations[i]
            acc = np.zeros(len(phases))
            for _ in range(inner):
                acc += steps[name]()
            for ph, t in zip(phases, acc / inner, strict=True):
                rows.append({"rep": rep, "position": pos, "implementation": name, "phase": ph, "seconds": t})
    frame = pd.DataFrame(rows)
    frame["inner"] = inner
    frame["clock"] = clock
    # nn.MultiheadAttention's fast path (torch._native_multi_head_attention) needs eval mode,
    # no grad, batch_first, query is key is value, and an even number of heads.
    fast = attention == "self" and mode == "inference" and num_heads % 2 == 0
    frame["mha_fast_path_eligible"] = fast & frame["implementation"].str.startswith("mha")
    return frame


STATISTICS = ("median_of_ratios", "ratio_of_medians")


def bootstrap_ratio(
    num, den, *, n_boot: int = 2000, seed: int = 0, level: float = LEVEL, statistic: str = "median_of_ratios"
) -> tuple[float, float, float]:
    """Ratio of paired timings with a percentile bootstrap CI (repetitions resampled jointly).

    statistic="median_of_ratios": median over repetitions of num_r / den_r. Both members
    of a pair ran in the same repetition, back to back, so slow drifts of machine load
    cancel in each ratio; this is the estimator we report.
    statistic="ratio_of_medians": median(num) / median(den), for reference.
    """
    _choice("statistic", statistic, STATISTICS)
    num = np.asarray(num, dtype=float)
    den = np.asarray(den, dtype=float)
    if num.shape != den.shape or num.ndim != 1 or len(num) < 2:
        raise ValueError("num and den must be 1-d arrays of the same length >= 2 (paired repetitions)")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(num), size=(n_boot, len(num)))
    if statistic == "median_of_ratios":
        r = num / den
        point, boot = float(np.median(r)), np.median(r[idx], axis=1)
    else:
        point = float(np.median(num) / np.median(den))
        boot = np.median(num[idx], axis=1) / np.median(den[idx], axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(boot, [alpha, 1 - alpha])
    return point, float(lo), float(hi)


def summarize(raw: pd.DataFrame, *, n_boot: int = 2000, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Median times per implementation and phase, and ratios with bootstrap CIs
    (see `bootstrap_ratio`; `value` is the median of paired ratios)."""
    keys = [c for c in ("device", "attention", "mode", "embed_dim", "seq_len", "batch", "num_heads") if c in raw]
    medians = (
        raw.groupby(keys + ["implementation", "phase"], sort=False)["seconds"]
        .agg(median_s="median", iqr_s=lambda s: s.quantile(0.75) - s.quantile(0.25), reps="count")
        .reset_index()
    )
    rows = []
    for key, grp in raw.groupby(keys + ["phase"], sort=False):
        wide = grp.pivot(index="rep", columns="implementation", values="seconds")
        for ratio, (a, b) in RATIOS.items():
            if a not in wide or b not in wide:
                continue
            r, lo, hi = bootstrap_ratio(wide[a].to_numpy(), wide[b].to_numpy(), n_boot=n_boot, seed=seed)
            rm, rm_lo, rm_hi = bootstrap_ratio(wide[a].to_numpy(), wide[b].to_numpy(), n_boot=n_boot, seed=seed,
                                               statistic="ratio_of_medians")
            rows.append({
                **dict(zip(keys + ["phase"], key, strict=True)),
                "ratio": ratio, "numerator": a, "denominator": b, "statistic": "median_of_ratios",
                "value": r, "ci_low": lo, "ci_high": hi, "ci_width": hi - lo,
                "contains_one": lo <= 1.0 <= hi,
                "ratio_of_medians": rm, "ratio_of_medians_ci_low": rm_lo, "ratio_of_medians_ci_high": rm_hi,
                "numerator_median_s": float(wide[a].median()), "denominator_median_s": float(wide[b].median()),
            })
    return medians, pd.DataFrame(rows)


# --------------------------------------------------------------------------- byte/FLOP model


def measure_machine(device="cpu", *, size_mb: int = 64, repeats: int = 5, embed_dim: int = 256, clock: str = "wall") -> dict:
    """Copy bandwidth (bytes/s, read+write counted) and the overhead of one small kernel."""
    _choice("clock", clock, CLOCKS)
    now = CLOCKS[clock]
    n = size_mb * 2**20 // 4
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 1):
        t0 = now()
        dst.copy_(src)
        _sync(device)
        times.append(now() - t0)
    bandwidth = 2 * src.nbytes / float(np.median(times[1:]))
    small = torch.ones(embed_dim, device=device)
    t = []
    for _ in range(repeats):
        t0 = now()
        for _ in range(200):
            small.sum(0)
        _sync(device)
        t.append((now() - t0) / 200)
    return {"bandwidth_bytes_per_s": bandwidth, "small_op_s": float(np.median(t))}


def optimizer_param_step_seconds(embed_dim: int, optimizer: str = "adam", device="cpu", repeats: int = 100, extra: int = 8, clock: str = "wall") -> float:
    """Measured marginal time that one more parameter of embed_dim entries adds to an
    optimizer step (the update that removing b_k deletes): (t(1 + extra) - t(1)) / extra,
    medians of single steps, so the fixed per-call overhead of step() cancels."""

    _choice("clock", clock, CLOCKS)
    now = CLOCKS[clock]

    def median_step(n: int) -> float:
        ps = [nn.Parameter(torch.zeros(embed_dim, device=device)) for _ in range(n)]
        opt = _make_optimizer(ps, optimizer)
        t = []
        for _ in range(repeats):
            for p in ps:
                p.grad = torch.ones_like(p)
            t0 = now()
            opt.step()
            _sync(device)
            t.append(now() - t0)
        return float(np.median(t[10:]))

    return max(0.0, (median_step(1 + extra) - median_step(1)) / extra)


def removed_work(embed_dim: int, seq_len: int, batch: int, optimizer: str = "adam", itemsize: int = 4) -> dict:
    """Values moved by the operations that disappear with b_k (key length = seq_len).

    forward: bias add reads and writes B*S*E; backward: grad reduction reads B*S*E and
    adds as many FLOPs; optimizer: touches E*(#state + 2) values (param, grad, states).
    """
    bse = batch * seq_len * embed_dim
    return {
        "forward_bytes": 2 * bse * itemsize,
        "backward_bytes": bse * itemsize,
        "step_bytes": embed_dim * (OPTIMIZER_STATES[optimizer] + 2) * itemsize,
        "forward_flops": bse,
        "backward_flops": bse,
    }


def predict_saving(ratios: pd.DataFrame, machine: dict, step_seconds: dict, optimizer: str = "adam") -> pd.DataFrame:
    """Add the byte model's predicted saving (seconds and fraction of A) to the no_bk rows.

    predicted_bytes_s = removed bytes / copy bandwidth; predicted_s adds one small-kernel
    overhead for the removed reduction and the measured one-parameter optimizer step.
    """
    out = ratios[ratios["ratio"] == "no_bk"].copy()
    bw = machine["bandwidth_bytes_per_s"]
    pb, ps = [], []
    for _, r in out.iterrows():
        w = removed_work(int(r.embed_dim), int(r.seq_len), int(r.batch), optimizer)
        fwd = w["forward_bytes"] / bw
        bwd = w["backward_bytes"] / bw
        stp = w["step_bytes"] / bw
        if r["mode"] == "inference":
            b, s = fwd, fwd
        else:
            by = {"forward": fwd, "backward": bwd, "step": stp, "total": fwd + bwd + stp}[r.phase]
            over = {"forward": 0.0, "backward": machine["small_op_s"], "step": step_seconds[int(r.embed_dim)]}
            over["total"] = sum(over.values())
            b, s = by, by + over[r.phase]
        pb.append(b)
        ps.append(s)
    out["predicted_bytes_s"] = pb
    out["predicted_s"] = ps
    out["measured_saving_s"] = out["denominator_median_s"] - out["numerator_median_s"]
    out["measured_saving"] = 1 - out["value"]
    out["saving_ci_low"] = 1 - out["ci_high"]
    out["saving_ci_high"] = 1 - out["ci_low"]
    out["predicted_saving"] = out["predicted_s"] / out["denominator_median_s"]
    out["distinguishable_from_zero"] = out["ci_high"] < 1.0
    return out


# --------------------------------------------------------------------------- sweep


def sweep_configs(embed_dims, seq_lens, batch_sizes, base_embed_dim, base_seq_len, base_batch, head_dim=64) -> pd.DataFrame:
    """One-axis-at-a-time grid around the base point; `axes` lists the axes a row belongs to."""
    for n, vals in (("embed_dims", embed_dims), ("seq_lens", seq_lens), ("batch_sizes", batch_sizes)):
        if not vals:
            raise ValueError(f"{n} must be a non-empty list of positive ints")
        for v in vals:
            _positive(n, v)
    rows: dict[tuple, list] = {}
    for axis, vals in (("embed_dim", embed_dims), ("seq_len", seq_lens), ("batch", batch_sizes)):
        for v in vals:
            cfg = {"embed_dim": base_embed_dim, "seq_len": base_seq_len, "batch": base_batch}
            cfg[axis] = v
            key = (cfg["embed_dim"], cfg["seq_len"], cfg["batch"])
            rows.setdefault(key, []).append(axis)
    out = pd.DataFrame([{"embed_dim": k[0], "seq_len": k[1], "batch": k[2], "axes": ",".join(a)} for k, a in rows.items()])
    out["num_heads"] = (out["embed_dim"] // head_dim).clip(lower=1)
    return out


def run_benchmark(
    *,
    embed_dims, seq_lens, batch_sizes, base_embed_dim, base_seq_len, base_batch,
    head_dim=64, attentions=ATTENTIONS, passes=PASSES, reps=30, warmup=2, min_rep_seconds=0.005,
    threads=1, optimizer="adam", n_boot=2000, seed=0, device="cpu", clock="process", progress=True,
) -> dict:
    """The timing sweep. Returns DataFrames: raw, medians, ratios, model (no_bk vs byte model),
    configs, and a dict `machine` (threads, bandwidth, small-op overhead)."""
    _choice("device", device, ("cpu", "cuda", "mps"))
    _choice("optimizer", optimizer, ("adam", "sgd_momentum"))
    _positive("threads", threads)
    _positive("reps", reps)
    if reps < 30:
        raise ValueError(f"reps={reps} must be >= 30")
    for a in attentions:
        _choice("attentions", a, ATTENTIONS)
    for p in passes:
        _choice("passes", p, PASSES)
    for e in embed_dims + [base_embed_dim]:
        if e >= head_dim and e % head_dim:
            raise ValueError(f"embed_dim={e} must be a multiple of head_dim={head_dim} (or below it)")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' requested but torch.cuda.is_available() is False")
    from tqdm.auto import tqdm

    torch.set_num_threads(threads)
    configs = sweep_configs(embed_dims, seq_lens, batch_sizes, base_embed_dim, base_seq_len, base_batch, head_dim)
    jobs = [(c, a, m) for c in configs.itertuples() for a in attentions for m in passes]
    raws = []
    for c, a, m in tqdm(jobs, disable=not progress, desc="cost timing"):
        raw = time_config(
            embed_dim=c.embed_dim, seq_len=c.seq_len, batch=c.batch, attention=a, mode=m, head_dim=head_dim,
            reps=reps, warmup=warmup, min_rep_seconds=min_rep_seconds, optimizer=optimizer, seed=seed, device=device, clock=clock)
        raw.insert(0, "num_heads", c.num_heads)
        raw.insert(0, "batch", c.batch)
        raw.insert(0, "seq_len", c.seq_len)
        raw.insert(0, "embed_dim", c.embed_dim)
        raw.insert(0, "mode", m)
        raw.insert(0, "attention", a)
        raw.insert(0, "device", device)
        raws.append(raw)
    raw = pd.concat(raws, ignore_index=True)
    medians, ratios = summarize(raw, n_boot=n_boot, seed=seed)
    machine = measure_machine(device, clock=clock)
    machine.update(threads=torch.get_num_threads(), interop_threads=torch.get_num_interop_threads(), device=device, clock=clock)
    step_s = {int(e): optimizer_param_step_seconds(int(e), optimizer, device, clock=clock) for e in configs["embed_dim"].unique()}
    model = predict_saving(ratios, machine, step_s, optimizer)
    for frame in (medians, ratios, model):
        frame.insert(0, "threads", machine["threads"])
        frame["mha_fast_path"] = (frame["attention"] == "self") & (frame["mode"] == "inference") & (frame["num_heads"] % 2 == 0)
    axes = configs.set_index(["embed_dim", "seq_len", "batch"])["axes"]
    ratios = ratios.join(axes, on=["embed_dim", "seq_len", "batch"])
    model = model.join(axes, on=["embed_dim", "seq_len", "batch"])
    return {"raw": raw, "medians": medians, "ratios": ratios, "model": model, "configs": configs, "machine": machine}


def not_run_rows(device: str, reason: str, passes=PASSES, attentions=ATTENTIONS) -> pd.DataFrame:
    """Rows for a device that was not available: status 'not run' with the reason."""
    return pd.DataFrame([
        {"device": device, "attention": a, "mode": m, "ratio": r, "status": "not run", "reason": reason}
        for a in attentions for m in passes for r in RATIOS
    ])


def device_status(device: str) -> pd.DataFrame:
    """Which devices the timing covered: the measured one, and cuda 'not run' when absent."""
    rows = [{"device": device, "status": "measured", "reason": ""}]
    if device != "cuda":
        if torch.cuda.is_available():
            rows.append({"device": "cuda", "status": "not run", "reason": "this run used DEVICE=" + device})
        else:
            rows.append({"device": "cuda", "status": "not run", "reason": "no CUDA GPU on this machine"})
    return pd.DataFrame(rows)


def summary_numbers(ratios: pd.DataFrame, model: pd.DataFrame) -> dict:
    """Headline numbers: control resolution, coverage, and the no_bk saving bounds."""
    tot = ratios[ratios["phase"].isin(["total", "forward"]) & ~((ratios["mode"] == "training") & (ratios["phase"] == "forward"))]
    ctrl = tot[tot["ratio"] == "control"]
    main = model[model["phase"].isin(["total", "forward"]) & ~((model["mode"] == "training") & (model["phase"] == "forward"))]
    train = main[main["mode"] == "training"]
    n = len(ctrl)
    return {
        "control_n": n,
        "control_contains_one": int(ctrl["contains_one"].sum()),
        "control_width_median": float(ctrl["ci_width"].median()),
        "control_width_max": float(ctrl["ci_width"].max()),
        "control_coverage_bound": binomial_lower_fraction(n, LEVEL, CHANCE_TAIL),
        "nobk_distinguishable": int(main["distinguishable_from_zero"].sum()),
        "nobk_n": len(main),
        "nobk_distinguishable_training": int(main.loc[main["mode"] == "training", "distinguishable_from_zero"].sum()),
        "nobk_n_training": int((main["mode"] == "training").sum()),
        "nobk_distinguishable_inference": int(main.loc[main["mode"] == "inference", "distinguishable_from_zero"].sum()),
        "nobk_n_inference": int((main["mode"] == "inference").sum()),
        "train_predicted_max": float(train["predicted_saving"].max()) if len(train) else float("nan"),
        # one-sided: the lower end of the saving's interval does not exceed the byte model's
        # prediction for the same configuration (no widening by the measurement noise)
        "train_n": len(train),
        "train_not_above_model": int((train["saving_ci_low"] <= train["predicted_saving"]).sum()),
        "train_not_above_model_bound": binomial_lower_fraction(len(train), 1 - (1 - LEVEL) / 2, CHANCE_TAIL),
        "nobk_slower": int((main["saving_ci_high"] < 0).sum()),
        "nobk_slower_training": int((train["saving_ci_high"] < 0).sum()),
        "nobk_slower_inference": int((main.loc[main["mode"] == "inference", "saving_ci_high"] < 0).sum()),
    }


def binomial_lower_fraction(n: int, p: float, tail: float) -> float:
    """Largest k/n such that P[Binomial(n, p) < k] <= tail: the fewest CIs (as a fraction)
    that may contain the truth, at coverage p, before chance alone explains it w.p. < tail."""
    if n <= 0:
        return 0.0
    cdf = 0.0
    for k in range(n + 1):
        pk = math.comb(n, k) * p**k * (1 - p) ** (n - k)
        if cdf + pk > tail:
            return k / n
        cdf += pk
    return 1.0


# --------------------------------------------------------------------------- notebook summaries


def _thousands(n) -> str:
    return f"{int(n):,}".replace(",", "{,}")


def memory_latex(memory: pd.DataFrame) -> str:
    """The booktabs tabular of `memory_table` for the paper (counts with LaTeX thousands)."""
    lines = [r"\begin{tabular}{lrrrrrr}", r"\toprule",
             r"Architecture & $E$ & layers & parameters & $b_k$ & $b_k$ of attn.\ (\%) & $b_k$ of model (\%) \\",
             r"\midrule"]
    for r in memory.itertuples():
        lines.append(f"{r.architecture} & {r.embed_dim} & {r.layers} & {_thousands(r.model_params)} & "
                     f"{_thousands(r.bk_params)} & {100 * r.bk_fraction_of_attention_layer:.4f} & "
                     f"{100 * r.bk_fraction_of_model:.4f} \\\\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)


def memory_claims(layer: pd.DataFrame, memory: pd.DataFrame) -> tuple[list[tuple], dict]:
    """Claims (id, statement, value, bound, comparison) and macros on memory.

    The BERT-base layer share is read from the real module row of `layer` (per_layer_memory)
    and compared exactly with the formula 1/(4E+4); the statement's numbers come from the data.
    """
    arch = memory.set_index("architecture")
    bert = arch.loc["BERT-base"]
    e = int(bert.embed_dim)
    by_e = layer.set_index("embed_dim")
    if e not in by_e.index:
        raise ValueError(f"per_layer_memory must include embed_dim={e} (BERT-base)")
    row = by_e.loc[e]
    pct_module = 100 * float(row.bk_params_module) / float(row.layer_params_module)
    pct_formula = 100 * e / mha_param_count(e)
    claims = [
        ("cost-bk-attention-layer-fraction-e768",
         f"Removing b_k saves 1/(4E+4) of an attention layer's parameters, {pct_formula:.4f}% at E = {e}, "
         "counted in nn.MultiheadAttention.", pct_module, pct_formula, "=="),
        ("cost-memory-counts-match-modules",
         "The b_k and whole-model parameter counts of all reference architectures equal those of the real modules.",
         int((~layer["match"]).sum() + (~memory["match"]).sum()), 0, "=="),
    ]
    xl = arch.loc["GPT-2 XL"]
    macros = {
        "CostBkFractionLayerPercent": pct_formula,
        "CostBertEmbedDim": e,
        "CostBkParamsBertBase": int(bert.bk_params),
        "CostBkParamsGptXL": int(xl.bk_params),
        "CostBkAdamBytesGptXL": int(xl.bk_training_adam_bytes),
        "CostModelFractionMaxPercent": float(100 * memory.bk_fraction_of_model.max()),
        "CostModelFractionMinPercent": float(100 * memory.bk_fraction_of_model.min()),
        "CostArchitectureCount": len(memory),
    }
    return claims, macros


def with_not_run(frame: pd.DataFrame, device: str, passes=PASSES, attentions=ATTENTIONS) -> pd.DataFrame:
    """The measured rows (status 'measured') plus `not_run_rows` for every device of
    `device_status` that was not run, with its reason: what the timing CSVs store."""
    out = frame.copy()
    out["status"], out["reason"] = "measured", ""
    absent = device_status(device)
    absent = absent[absent["status"] == "not run"]
    extra = [not_run_rows(r.device, r.reason, passes, attentions) for r in absent.itertuples()]
    if "ratio" in out and out["ratio"].nunique() == 1:  # the byte-model table holds no_bk only
        extra = [x[x["ratio"] == out["ratio"].iloc[0]] for x in extra]
    return pd.concat([out, *extra], ignore_index=True) if extra else out


MAIN_VIEWS = (("inference", "forward", "inference (forward)"), ("training", "total", "training step (fwd+bwd+Adam)"))


def main_view(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of the headline phases: inference forward and the whole training step."""
    keep = np.zeros(len(frame), dtype=bool)
    for mode, phase, _ in MAIN_VIEWS:
        keep |= ((frame["mode"] == mode) & (frame["phase"] == phase)).to_numpy()
    return frame[keep]


def _panel_rows(frame: pd.DataFrame, axis: str, base: dict) -> pd.DataFrame:
    sel = frame
    for k, v in base.items():
        if k != axis:
            sel = sel[sel[k] == v]
    return sel.sort_values(axis)


def time_ratio_figure(ratios: pd.DataFrame, model: pd.DataFrame, *, base_embed_dim: int, base_seq_len: int,
                      base_batch: int, attentions, passes, device: str, threads: int):
    """B/A with its CI against each size axis (others at the base point), the control band
    and the byte model's predicted ratio; one row of panels per headline phase."""
    import matplotlib.pyplot as plt

    base = {"embed_dim": base_embed_dim, "seq_len": base_seq_len, "batch": base_batch}
    views = [v for v in MAIN_VIEWS if v[0] in passes]
    fig, axs = plt.subplots(len(views), 3, figsize=(10, 3.2 * len(views)), squeeze=False, sharey="row")
    for i, (mode, phase, title) in enumerate(views):
        sub = ratios[(ratios["mode"] == mode) & (ratios["phase"] == phase)]
        pred_all = model[(model["mode"] == mode) & (model["phase"] == phase)]
        for j, axis in enumerate(base):
            ax = axs[i][j]
            for k, att in enumerate(attentions):
                main = _panel_rows(sub[(sub["ratio"] == "no_bk") & (sub["attention"] == att)], axis, base)
                ctrl = _panel_rows(sub[(sub["ratio"] == "control") & (sub["attention"] == att)], axis, base)
                shift = 1.0 + 0.04 * (k - 0.5)
                ax.errorbar(main[axis] * shift, main["value"],
                            yerr=[main["value"] - main["ci_low"], main["ci_high"] - main["value"]],
                            fmt="o-", capsize=3, label=f"B/A ({att})")
                ax.fill_between(ctrl[axis], ctrl["ci_low"], ctrl["ci_high"], color="grey", alpha=0.15,
                                label="control CI" if k == 0 else None)
                pred = _panel_rows(pred_all[pred_all["attention"] == att], axis, base)
                ax.plot(pred[axis], 1 - pred["predicted_saving"], ls="--", lw=1, color=f"C{k}",
                        label=f"byte model ({att})")
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xlabel(axis)
            if j == 0:
                ax.set_ylabel(f"time ratio, {title}")
    axs[0][0].legend(fontsize=7)
    fig.suptitle(f"Key bias removed (B) vs present (A), {device}, {threads} thread(s); machine-specific", fontsize=9)
    fig.tight_layout()
    return fig


def _where(r) -> str:
    return f"{r.attention}-attention {r['mode']}, $E={int(r.embed_dim)}$, $L={int(r.seq_len)}$, $B={int(r.batch)}$"


def cuda_sentence(device: str) -> str:
    """One sentence for the paper on the CUDA rows: measured on which GPU, or why not run."""
    if device == "cuda":
        return f"The same benchmark ran on a CUDA GPU ({torch.cuda.get_device_name(0)})."
    status = device_status(device).set_index("device")
    if "cuda" in status.index:
        return "The CUDA rows read ``not run'' (" + status.loc["cuda", "reason"] + ")."
    return ""


def timing_claims(ratios: pd.DataFrame, model: pd.DataFrame) -> tuple[list[tuple], dict]:
    """Claims and macros of the timing sweep (values only; run facts are added by the caller).

    - control coverage: identical implementations give intervals containing 1 in at least
      the share a Binomial(n, LEVEL) reaches except with probability CHANCE_TAIL;
    - training saving not above the model: per training configuration the lower end of the
      saving's interval is at most the byte-and-overhead model's prediction for that
      configuration (a bound from the model alone); a one-sided LEVEL interval misses with
      probability (1-LEVEL)/2, so the share that must hold is the binomial quantile of that.
    No training rows: the training claim is not recorded (the caller's profile has none).
    """
    s = summary_numbers(ratios, model)
    if s["control_n"] == 0:
        raise ValueError("no control rows: run_benchmark produced no headline phases")
    claims = [("cost-control-ci-contains-one",
               "Two identical implementations timed against each other give a ratio CI containing 1 in the expected share of configurations.",
               s["control_contains_one"] / s["control_n"], s["control_coverage_bound"], ">=")]
    view = main_view(model)
    chance = (1 - LEVEL) / 2
    macros = {
        "CostLevelPercent": round(100 * LEVEL),
        "CostControlWidthMedianPercent": 100 * s["control_width_median"],
        "CostControlWidthMaxPercent": 100 * s["control_width_max"],
        "CostControlContainsOne": s["control_contains_one"],
        "CostControlCount": s["control_n"],
        "CostControlExcludesOne": s["control_n"] - s["control_contains_one"],
        "CostDistinguishable": s["nobk_distinguishable"],
        "CostComparisons": s["nobk_n"],
        "CostDistinguishableByChance": format_number(chance * s["nobk_n"], 2),
        "CostDistinguishableTraining": s["nobk_distinguishable_training"],
        "CostComparisonsTraining": s["nobk_n_training"],
        "CostDistinguishableInference": s["nobk_distinguishable_inference"],
        "CostComparisonsInference": s["nobk_n_inference"],
        "CostSlower": s["nobk_slower"],
        "CostSlowerTraining": s["nobk_slower_training"],
        "CostSlowerInference": s["nobk_slower_inference"],
    }
    excluded, nominal = s["control_n"] - s["control_contains_one"], (1 - LEVEL) * s["control_n"]
    level_miss = f"{100 * (1 - LEVEL):g}"
    macros["CostControlVerdict"] = (
        rf"more than the nominal {level_miss}\%, so the intervals are somewhat optimistic on this machine"
        if excluded > nominal else rf"in line with the nominal {level_miss}\%")
    clear = view.loc[view["saving_ci_low"].idxmax()]  # the most clearly positive saving
    point = view.loc[view["measured_saving"].idxmax()]  # the largest point estimate
    for tag, r in (("LargestSaving", clear), ("LargestPointSaving", point)):
        macros[f"Cost{tag}Percent"] = 100 * float(r.measured_saving)
        macros[f"Cost{tag}LowPercent"] = 100 * float(r.saving_ci_low)
        macros[f"Cost{tag}HighPercent"] = 100 * float(r.saving_ci_high)
        macros[f"Cost{tag}Where"] = _where(r)
    slowest = view.loc[view["saving_ci_high"].idxmin()]  # the most clearly slower configuration
    macros["CostSlowestWhere"] = _where(slowest)
    macros["CostSlowestLowPercent"] = 100 * float(slowest.saving_ci_low)
    macros["CostSlowestHighPercent"] = 100 * float(slowest.saving_ci_high)
    nb = main_view(ratios[ratios["ratio"] == "no_bias_mha"])
    macros["CostNoBiasMhaMedianPercent"] = 100 * float(1 - nb["value"].median())
    if s["train_n"]:
        claims.append((
            "cost-training-saving-not-above-model",
            "In (at least the expected share of) training configurations the measured saving from removing b_k "
            "is not significantly larger than the byte-and-overhead model of the removed work predicts for that configuration.",
            s["train_not_above_model"] / s["train_n"], s["train_not_above_model_bound"], ">="))
        macros.update({
            "CostTrainPredictedMaxPercent": 100 * s["train_predicted_max"],
            "CostTrainNotAboveModel": s["train_not_above_model"],
            "CostTrainCount": s["train_n"],
        })
    return claims, macros


# --------------------------------------------------------------------------- command line

FULL_SWEEP = dict(
    embed_dims=[64, 128, 256, 512, 1024, 2048], seq_lens=[16, 64, 256, 1024, 2048], batch_sizes=[1, 8, 32],
    base_embed_dim=256, base_seq_len=128, base_batch=8, head_dim=64, attentions=list(ATTENTIONS),
    passes=list(PASSES), reps=30, warmup=3, min_rep_seconds=0.01, optimizer="adam", n_boot=2000, seed=0,
    clock="process",
)
QUICK_SWEEP = dict(FULL_SWEEP, embed_dims=[64, 256], seq_lens=[16, 128], batch_sizes=[2], base_embed_dim=64,
                   base_seq_len=16, base_batch=2, min_rep_seconds=0.0, n_boot=500)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keybias.cost", description="Key-bias timing benchmark (machine-specific).")
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--full", action="store_true", help="the full sweep (embed_dim 64..2048, seq 16..2048, batch 1..32; long)")
    size.add_argument("--quick", action="store_true", help="a tiny sweep to check the command works (seconds)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, mps or auto (default cpu)")
    parser.add_argument("--out", default="results/data", type=Path, help="output folder (default results/data)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="process",
                        help="process CPU time (default; robust on a shared machine) or wall time; cuda always uses wall")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores torch sees)")
    args = parser.parse_args(argv)
    from keybias.export import atomic_write_text
    from keybias.params import ParameterError, resolve_device

    try:
        device = resolve_device(args.device)
    except ParameterError as exc:
        parser.error(str(exc))
    threads = args.threads if args.threads is not None else torch.get_num_threads()
    if threads <= 0:
        parser.error(f"--threads must be positive, got {threads}")
    spec = dict(FULL_SWEEP if args.full else QUICK_SWEEP, threads=threads, device=device,
                clock="wall" if device == "cuda" else args.clock)
    t0 = time.time()
    res = run_benchmark(**spec)
    wall = time.time() - t0
    out = args.out
    atomic_write_text(out / "cost_bench_timing_ratios.csv", res["ratios"].to_csv(index=False, float_format="%.9g"))
    atomic_write_text(out / "cost_bench_timing_medians.csv", res["medians"].to_csv(index=False, float_format="%.9g"))
    atomic_write_text(out / "cost_bench_timing_model.csv", res["model"].to_csv(index=False, float_format="%.9g"))
    atomic_write_text(out / "cost_bench_devices.csv", device_status(device).to_csv(index=False))
    from keybias import provenance

    prov = {
        "machine_specific": True,
        "sweep": "full" if args.full else "quick",
        "spec": spec,
        "wall_seconds": wall,
        "measured": res["machine"],
        "summary": summary_numbers(res["ratios"], res["model"]),
        **provenance.collect(Path.cwd()),
    }
    atomic_write_text(out / "cost_bench_provenance.json", json.dumps(prov, indent=2, default=str) + "\n")
    print(f"wrote {out}/cost_bench_*.csv and cost_bench_provenance.json in {wall:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
