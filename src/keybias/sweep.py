"""The invariance map: does changing b_k change what an attention module computes?

For each configuration (module, options, mode, mask, sizes, dtype, device) we

1. build the module twice from one seed, in the configuration's dtype and in float64, with
   nonzero random biases (PyTorch initialises in_proj_bias to zero);
2. perturb b_k by random vectors whose norm is `m` times the median key norm, for every
   magnitude m, and record the largest absolute and relative change of the output;
3. perturb b_q and b_v the same way (relative to the median query / value norm): the positive
   controls. A control within rounding makes the configuration `invalid`;
4. repeat 2-3 in float64 (the noise floor) and set b_k to zero (the "drop" surgery);
5. compare each change with `keybias.verdict.output_tolerance`, the rounding bound built from
   the unit roundoff, the head size, the number of keys, the score magnitude (with the
   perturbed b_k) and the value magnitude mapped through the output projection;
6. take one backward pass and compare |dL/db_k| with `keybias.verdict.gradient_tolerance`
   and with |dL/db_q|, |dL/db_v|;
7. record which code path ran: nn.MultiheadAttention's fused fast path
   (torch._native_multi_head_attention) or its slow path, and, when
   F.scaled_dot_product_attention ran, the backend it chose (torch._fused_sdp_choice) or was
   forced to use (torch.nn.attention.sdpa_kernel).

A configuration PyTorch rejects is a row with status `rejected` and PyTorch's message; a
device that is absent gives rows with status `absent_device`. Both have verdict `skipped`.

`expected_verdict` states what the proof predicts for each configuration and which of its
assumptions fails (see keybias.variants for (A1)-(A4)); the notebook checks the measurement
against it.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm.auto import tqdm

from keybias import variants as V
from keybias import verdict as VD
from keybias.hf_attention import MODELS as HF_MODELS
from keybias.params import DTYPES, Param

FAMILIES = ("mha", "sizes", "layers", "sdpa", "variants", "hf")
OPTIONS = (
    "plain",
    "bias_false",
    "add_bias_kv",
    "add_zero_attn",
    "add_bias_kv_zero_attn",
    "kdim_vdim",
    "dropout",
)
MODES = ("train", "eval", "inference", "inference_no_fastpath")
MASKS = (
    "none",
    "bool",
    "float",
    "causal",
    "is_causal",
    "is_causal_only",
    "key_padding",
    "fully_masked_row",
)
SDPA_BACKENDS = ("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
LAYERS = ("encoder_layer", "decoder_layer_self", "decoder_layer_cross", "transformer")
ALL_DEVICES = ("cpu", "cuda", "mps")
DROPOUT_P = 0.1
_BACKEND_NAMES = {int(v.value): k for k, v in SDPBackend.__members__.items()}


PARAMETERS = {
    "families": Param(str, many=True, choices=FAMILIES, help="which parts of the map to run"),
    "embed_dims": Param(int, many=True, positive=True, help="embed_dim values of the MHA grid"),
    "num_heads": Param(
        int, many=True, positive=True,
        help="num_heads values of the MHA grid (those dividing embed_dim; num_heads=embed_dim is always added)",
    ),
    "seq_len": Param(int, positive=True, help="query = key length of the option grid"),
    "batch_size": Param(int, positive=True, help="batch of the option grid"),
    "options": Param(str, many=True, choices=OPTIONS, help="constructor options of nn.MultiheadAttention"),
    "modes": Param(str, many=True, choices=MODES, help="train / eval / no_grad with the fast path on or off"),
    "masks": Param(str, many=True, choices=MASKS, help="attn_mask / is_causal / key_padding_mask kinds"),
    "need_weights": Param(bool, many=True, help="need_weights values"),
    "batch_first": Param(bool, many=True, help="batch_first values (cycled over the grid)"),
    "dtypes": Param(str, many=True, choices=DTYPES, help="dtypes"),
    "sizes": Param(
        str, many=True,
        help="size sweep entries 'embed_dim:num_heads:tgt_len:src_len:batch' (plain MHA)",
    ),
    "size_dtypes": Param(str, many=True, choices=DTYPES, help="dtypes of the size sweep"),
    "variants": Param(str, many=True, choices=V.VARIANTS, help="reference variants (keybias.variants)"),
    "hf_models": Param(str, many=True, choices=HF_MODELS, help="Hugging Face families (keybias.hf_attention.MODELS)"),
    "magnitudes": Param(
        float, many=True, positive=True, help="|delta| / median key norm of the perturbations"
    ),
    "seed": Param(int, minimum=0, help="seed of weights, inputs and perturbations"),
}


# ----------------------------------------------------------------------------- validation
def _check_list(name: str, values, allowed) -> list:
    values = list(values)
    if not values:
        raise ValueError(f"{name} must be non-empty; allowed: {list(allowed)}")
    bad = [v for v in values if v not in allowed]
    if bad:
        raise ValueError(f"{name}: {bad} not allowed; allowed: {list(allowed)}")
    return values


def parse_size(text: str) -> tuple[int, int, int, int, int]:
    """'E:H:Lq:Lk:B' -> ints; ValueError if malformed or num_heads does not divide embed_dim."""
    parts = str(text).split(":")
    try:
        e, h, lq, lk, b = (int(p) for p in parts)
    except ValueError:
        raise ValueError(
            f"sizes entry {text!r} must be 'embed_dim:num_heads:tgt_len:src_len:batch' (integers)"
        ) from None
    if min(e, h, lq, lk, b) <= 0 or e % h:
        raise ValueError(f"sizes entry {text!r}: all positive and num_heads must divide embed_dim")
    return e, h, lq, lk, b


# ----------------------------------------------------------------------------- configurations
def _base(**kw) -> dict:
    cfg = {
        "family": "mha", "case": "", "variant": "softmax", "option": "plain", "mode": "eval",
        "mask": "none", "embed_dim": 8, "num_heads": 2, "kdim": None, "vdim": None,
        "tgt_len": 5, "src_len": 5, "batch": 2, "batch_first": True, "bias": True,
        "add_bias_kv": False, "add_zero_attn": False, "dropout": 0.0, "need_weights": False,
        "self_attention": True, "dtype": "float32", "device": "cpu", "sdpa_backend": "default",
        "hf_attn_implementation": "", "seed": 0,
    }
    cfg.update(kw)
    return cfg


def _option_kwargs(option: str, embed_dim: int) -> dict:
    kw = {"option": option}
    if option == "bias_false":
        kw["bias"] = False
    if option in ("add_bias_kv", "add_bias_kv_zero_attn"):
        kw["add_bias_kv"] = True
    if option in ("add_zero_attn", "add_bias_kv_zero_attn"):
        kw["add_zero_attn"] = True
    if option == "kdim_vdim":
        kw.update(kdim=embed_dim + 3, vdim=max(embed_dim // 2, 1) + 1, self_attention=False)
    if option == "dropout":
        kw["dropout"] = DROPOUT_P
    return kw


def _heads_for(embed_dim: int, num_heads: list[int]) -> list[int]:
    return sorted({h for h in num_heads if embed_dim % h == 0} | {embed_dim})


def build_configs(
    *,
    families,
    embed_dims,
    num_heads,
    seq_len,
    batch_size,
    options,
    modes,
    masks,
    need_weights,
    batch_first,
    dtypes,
    sizes,
    size_dtypes,
    variants,
    hf_models,
    seed=0,
    device="cpu",
) -> list[dict]:
    """All configurations of one sweep (validated first; ValueError names the bad value)."""
    families = _check_list("families", families, FAMILIES)
    options = _check_list("options", options, OPTIONS)
    modes = _check_list("modes", modes, MODES)
    masks = _check_list("masks", masks, MASKS)
    dtypes = _check_list("dtypes", dtypes, DTYPES)
    size_dtypes = _check_list("size_dtypes", size_dtypes, DTYPES)
    variants = _check_list("variants", variants, V.VARIANTS)
    hf_models = _check_list("hf_models", hf_models, HF_MODELS)
    _check_list("device", [device], ALL_DEVICES)
    need_weights = _check_list("need_weights", need_weights, (True, False))
    batch_first = _check_list("batch_first", batch_first, (True, False))
    for name, vals in (("embed_dims", embed_dims), ("num_heads", num_heads)):
        if not vals or any(int(v) <= 0 for v in vals):
            raise ValueError(f"{name} must be a non-empty list of positive integers, got {vals!r}")
    if seq_len <= 0 or batch_size <= 0:
        raise ValueError("seq_len and batch_size must be positive")
    parsed = [parse_size(s) for s in sizes]
    devices = ["cpu"] + ([device] if device != "cpu" else [])
    pairs = [(e, h) for e in embed_dims for h in _heads_for(e, num_heads)]
    cfgs: list[dict] = []
    for dev in devices:
        common = {"device": dev, "seed": seed, "tgt_len": seq_len, "src_len": seq_len, "batch": batch_size}
        if "mha" in families:
            grid = itertools.product(options, modes, masks, dtypes, need_weights)
            for i, (opt, mode, mask, dt, nw) in enumerate(grid):
                e, h = pairs[i % len(pairs)]
                bf = batch_first[(i // len(pairs)) % len(batch_first)]
                kw = {**common, "embed_dim": e, "num_heads": h, "mode": mode, "mask": mask,
                      "dtype": dt, "need_weights": nw, "batch_first": bf}
                kw.update(_option_kwargs(opt, e))
                cfgs.append(_base(family="mha", case=f"MHA {opt}", **kw))
            # every (embed_dim, num_heads) pair crossed with batch_first, mask, dtype and need_weights for
            # the plain module (the option grid above cycles the shapes); modes are cycled
            shapes = itertools.product(pairs, batch_first, masks, dtypes, need_weights)
            for i, ((e, h), bf, mask, dt, nw) in enumerate(shapes):
                cfgs.append(_base(family="mha", case="MHA shapes", **{
                    **common, "embed_dim": e, "num_heads": h, "batch_first": bf, "mask": mask, "dtype": dt,
                    "need_weights": nw, "mode": modes[i % len(modes)]}))
            # single key and the option that breaks it
            for opt, dt in itertools.product(("plain", "add_zero_attn"), dtypes):
                kw = {**common, "tgt_len": 4, "src_len": 1, "self_attention": False, "dtype": dt}
                kw.update(_option_kwargs(opt, 8))
                cfgs.append(_base(family="mha", case=f"MHA single key {opt}", **kw))
        if "sizes" in families:
            for (e, h, lq, lk, b), dt in itertools.product(parsed, size_dtypes):
                cfgs.append(_base(
                    family="sizes", case="MHA sizes", embed_dim=e, num_heads=h, tgt_len=lq,
                    src_len=lk, batch=b, self_attention=lq == lk, dtype=dt, device=dev,
                    seed=seed, mode="inference",
                ))
        if "layers" in families:
            for layer, mode, dt, nf in itertools.product(LAYERS, ("train", "eval"), dtypes, (False, True)):
                cfgs.append(_base(
                    family="layers", case=layer, variant=layer, option="norm_first" if nf else "plain",
                    mode=mode, mask="causal" if layer != "encoder_layer" else "none", dtype=dt,
                    embed_dim=16, num_heads=4, dropout=DROPOUT_P if mode == "train" else 0.0,
                    **{k: v for k, v in common.items()},
                ))
        if "sdpa" in families:
            for be, mask, dt, p in itertools.product(
                SDPA_BACKENDS, ("none", "bool", "float", "is_causal"), dtypes, (0.0, DROPOUT_P)
            ):
                cfgs.append(_base(
                    family="sdpa", case=f"SDPA {be}", sdpa_backend=be, mask=mask, dtype=dt,
                    dropout=p, mode="train" if p else "eval", embed_dim=16, num_heads=2,
                    **common,
                ))
        if "variants" in families:
            for var, dt, mask in itertools.product(variants, dtypes, ("none", "causal")):
                cfgs.append(_base(
                    family="variants", case=f"variant {var}", variant=var, dtype=dt, mask=mask,
                    embed_dim=16, num_heads=2, **common,
                ))
        if "hf" in families:
            for name, impl, dt in itertools.product(hf_models, ("eager", "sdpa"), dtypes):
                cfgs.append(_base(
                    family="hf", case=f"HF {name}", variant=name, hf_attn_implementation=impl,
                    dtype=dt, embed_dim=16, num_heads=2, mask="causal" if name in ("gpt2", "qwen2") else "none",
                    **common,
                ))
    present = {"cpu": True, "cuda": torch.cuda.is_available(),
               "mps": bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())}
    for dev in ALL_DEVICES:
        if not present[dev]:
            cfgs.append(_base(family="device", case=f"device {dev}", device=dev, dtype="float32"))
    return cfgs


# ----------------------------------------------------------------------------- helpers
_DT = {name: getattr(torch, name) for name in DTYPES}


def _seed(seed: int) -> None:
    """Reset the generators dropout draws from (cheaper than torch.manual_seed per call)."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


@contextlib.contextmanager
def _trace_paths(log: list):
    """Record which attention kernels run: MHA's fused fast path and SDPA with its backend."""
    orig_native = torch._native_multi_head_attention
    orig_sdpa = F.scaled_dot_product_attention

    def native(*args, **kwargs):
        log.append("mha_fast_path")
        return orig_native(*args, **kwargs)

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        try:
            choice = torch._fused_sdp_choice(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                            is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
            log.append("sdpa:" + _BACKEND_NAMES.get(int(choice), str(choice)))
        except Exception:  # noqa: BLE001 - the choice is informative only
            log.append("sdpa:unknown")
        return orig_sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                         scale=scale, enable_gqa=enable_gqa)

    torch._native_multi_head_attention = native
    F.scaled_dot_product_attention = sdpa
    try:
        yield log
    finally:
        torch._native_multi_head_attention = orig_native
        F.scaled_dot_product_attention = orig_sdpa


def _describe_path(log: list, family: str) -> tuple[str, str]:
    backends = sorted({x.split(":", 1)[1] for x in log if x.startswith("sdpa:")})
    backend = "+".join(backends) if backends else "none"
    if "mha_fast_path" in log:
        return "mha_fast_path", "native"
    if family in ("mha", "sizes", "layers"):
        return ("slow_path_sdpa" if backends else "slow_path_explicit_softmax"), backend
    return ("sdpa" if backends else "explicit_softmax"), backend


@contextlib.contextmanager
def _mode(cfg: dict, *, grad: bool | None = None):
    """Grad mode, fast-path switch and forced SDPA backend of a configuration."""
    mode = cfg["mode"]
    if grad is None:
        grad = mode in ("train", "eval")
    old_fast = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(mode != "inference_no_fastpath")
    stack = contextlib.ExitStack()
    stack.enter_context(torch.enable_grad() if grad else torch.no_grad())
    if cfg["sdpa_backend"] != "default":
        stack.enter_context(sdpa_kernel([getattr(SDPBackend, cfg["sdpa_backend"])]))
    try:
        with stack:
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(old_fast)


def _masks(cfg: dict, gen: torch.Generator, dtype, device):
    """(attn_mask, key_padding_mask, is_causal) for cfg['mask']; every row keeps a key unless asked."""
    lq, lk, b, kind = cfg["tgt_len"], cfg["src_len"], cfg["batch"], cfg["mask"]
    attn, kpm, causal = None, None, False
    tri = torch.ones(lq, lk, dtype=torch.bool).triu(1 + max(lk - lq, 0))
    if kind == "bool":
        attn = torch.rand(lq, lk, generator=gen) < 0.3
        attn[:, 0] = False
    elif kind == "float":
        attn = torch.randn(lq, lk, generator=gen, dtype=torch.float64).to(dtype)
    elif kind == "causal":
        attn = tri
    elif kind == "is_causal":
        attn, causal = tri, True
    elif kind == "is_causal_only":
        causal = True
    elif kind == "key_padding":
        kpm = torch.zeros(b, lk, dtype=torch.bool)
        kpm[:, max(lk // 2, 1):] = torch.rand(b, lk - max(lk // 2, 1), generator=gen) < 0.7
    elif kind == "fully_masked_row":
        attn = torch.zeros(lq, lk, dtype=torch.bool)
        attn[0] = True
    to = (lambda t: None if t is None else t.to(device))  # noqa: E731
    return to(attn), to(kpm), causal


def _stats(q, k, v, w_o, num_heads, dropout=0.0) -> dict:
    """Magnitudes for the verdict's tolerances from batch-first projections [B, L, H*d] (float64).

    S bounds max_ij sum_t |q_it k_jt| / sqrt(d) by Cauchy-Schwarz (||q_i|| ||k_j|| / sqrt(d));
    V_o = max_i sum_t |W_o[i,t]| max_j |v_jt| (the value bound seen through W_o); V_g the same
    with column sums of |W_o|, per head and divided by d, for the gradient bound."""
    q, k, v = q.detach(), k.detach(), v.detach()
    w_o = None if w_o is None else w_o.detach()
    b, lq, e = q.shape
    d = e // num_heads
    qh = q.reshape(b, lq, num_heads, d)
    kh = k.reshape(b, k.shape[1], num_heads, d)
    qn = qh.norm(dim=-1).amax(dim=(0, 1))
    kn = kh.norm(dim=-1).amax(dim=(0, 1))
    s = float((qn * kn).max().detach()) / math.sqrt(d)
    vmax = v.abs().amax(dim=(0, 1))
    dv = vmax.numel() // num_heads
    if w_o is None:
        v_o = float(vmax.max())
        v_g = float(vmax.reshape(num_heads, dv).sum(-1).max()) / d
        out_dim = 0
    else:
        wa = w_o.abs()
        v_o = float((wa @ vmax).max())
        v_g = float(((wa.sum(0) * vmax).reshape(num_heads, dv).sum(-1)).max()) / d
        out_dim = vmax.numel()
    scale = 1.0 / (1.0 - dropout)
    return {"S": s, "V_o": v_o * scale, "V_g": v_g * scale, "Q": float(q.abs().max()),
            "head_dim": d, "out_dim": out_dim,
            "norm_q": _typical(q), "norm_k": _typical(k), "norm_v": _typical(v)}


def _typical(t: torch.Tensor) -> float:
    """Median norm of the nonzero rows (the zero slot of add_zero_attn is not a typical key)."""
    n = t.norm(dim=-1).flatten()
    n = n[n > 0]
    return float(n.median()) if n.numel() else 0.0


# ----------------------------------------------------------------------------- cases
# A case is a dict of closures over one configuration:
#   build(dtype) -> (obj, inputs)   deterministic from the seed, float64 then cast
#   run(obj, inputs) -> output tensor (the thing compared)
#   roles(obj) -> {"b_q": [views], "b_k": [...], "b_v": [...], "joint": [...]} (in-place views)
#   stats(obj, inputs) -> (q, k, v, w_o, n_slots): float64 projections for the tolerance
#   params(obj) -> parameters whose .grad we read for b_q, b_k, b_v

def _randomize_biases(module: nn.Module, gen: torch.Generator, scale=0.5) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias") or name in ("bias_k", "bias_v") or name.endswith(".bias_k") or name.endswith(".bias_v"):
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * scale)


def _mha_projections(m: nn.MultiheadAttention, q_in, k_in, v_in, batch_first: bool):
    """Float64 q, k, v [B, L, ·] of an nn.MultiheadAttention, extra slots included."""
    if not batch_first:
        q_in, k_in, v_in = (t.transpose(0, 1) for t in (q_in, k_in, v_in))
    e = m.embed_dim
    if m._qkv_same_embed_dim:
        wq, wk, wv = m.in_proj_weight.chunk(3)
    else:
        wq, wk, wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
    bias = m.in_proj_bias if m.in_proj_bias is not None else torch.zeros(3 * e, dtype=wq.dtype)
    bq, bk, bv = bias.chunk(3)
    q = q_in.double() @ wq.double().T + bq.double()
    k = k_in.double() @ wk.double().T + bk.double()
    v = v_in.double() @ wv.double().T + bv.double()
    bsz = q.shape[0]
    if m.bias_k is not None:
        k = torch.cat([k, m.bias_k.double().reshape(1, 1, e).expand(bsz, 1, e)], 1)
        v = torch.cat([v, m.bias_v.double().reshape(1, 1, e).expand(bsz, 1, e)], 1)
    if m.add_zero_attn:
        k = torch.cat([k, torch.zeros(bsz, 1, e, dtype=k.dtype)], 1)
        v = torch.cat([v, torch.zeros(bsz, 1, e, dtype=v.dtype)], 1)
    return q, k, v


def _mha_roles(m: nn.MultiheadAttention) -> dict:
    if m.in_proj_bias is None:
        return {}
    bq, bk, bv = m.in_proj_bias.data.chunk(3)
    roles = {"b_q": [bq], "b_k": [bk], "b_v": [bv]}
    if m.bias_k is not None:
        roles["joint"] = [bk, m.bias_k.data.view(-1)]
    return roles


def _mha_case(cfg: dict) -> dict:
    e, h = cfg["embed_dim"], cfg["num_heads"]
    kdim, vdim = cfg["kdim"] or e, cfg["vdim"] or e
    dev = cfg["device"]

    def build(dtype):
        _seed(cfg["seed"])
        gen = torch.Generator().manual_seed(cfg["seed"] + 1)
        m = nn.MultiheadAttention(
            e, h, dropout=cfg["dropout"], bias=cfg["bias"], add_bias_kv=cfg["add_bias_kv"],
            add_zero_attn=cfg["add_zero_attn"], kdim=cfg["kdim"], vdim=cfg["vdim"],
            batch_first=cfg["batch_first"], dtype=torch.float64,
        )
        _randomize_biases(m, gen)
        m = m.to(dev, dtype).train(cfg["mode"] == "train")
        b, lq, lk = cfg["batch"], cfg["tgt_len"], cfg["src_len"]

        def inp(n, width):
            t = torch.randn(b, n, width, generator=gen, dtype=torch.float64).to(dev, dtype)
            return t if cfg["batch_first"] else t.transpose(0, 1).contiguous()

        x = inp(lq, e)
        if cfg["self_attention"] and kdim == e and vdim == e and lq == lk:
            key = value = x
        else:
            key, value = inp(lk, kdim), inp(lk, vdim)
        attn, kpm, causal = _masks(cfg, gen, dtype, dev)
        return m, {"q": x, "k": key, "v": value, "attn_mask": attn, "kpm": kpm, "is_causal": causal}

    def run(m, i):
        _seed(cfg["seed"] + 2)  # same dropout mask in every run
        return m(i["q"], i["k"], i["v"], key_padding_mask=i["kpm"], need_weights=cfg["need_weights"],
                 attn_mask=i["attn_mask"], is_causal=i["is_causal"])[0]

    def stats(m, i):
        q, k, v = _mha_projections(m, i["q"], i["k"], i["v"], cfg["batch_first"])
        return q, k, v, m.out_proj.weight.double(), k.shape[1]

    def grads(m):
        g = m.in_proj_bias.grad
        return g.chunk(3) if g is not None else None

    return {"build": build, "run": run, "roles": _mha_roles, "stats": stats, "grads": grads}


def _layer_case(cfg: dict) -> dict:
    """nn.TransformerEncoderLayer / DecoderLayer / Transformer; perturb one attention module and
    compare that module's output (captured by a forward hook) and the whole module's output."""
    e, h, kind = cfg["embed_dim"], cfg["num_heads"], cfg["variant"]
    nf = cfg["option"] == "norm_first"
    dev = cfg["device"]

    def build(dtype):
        _seed(cfg["seed"])
        gen = torch.Generator().manual_seed(cfg["seed"] + 1)
        kw = {"dropout": cfg["dropout"], "batch_first": True, "norm_first": nf, "dtype": torch.float64,
              "dim_feedforward": 2 * e}
        if kind == "encoder_layer":
            mod = nn.TransformerEncoderLayer(e, h, **kw)
            att = mod.self_attn
        elif kind.startswith("decoder_layer"):
            mod = nn.TransformerDecoderLayer(e, h, **kw)
            att = mod.self_attn if kind.endswith("self") else mod.multihead_attn
        else:
            mod = nn.Transformer(e, h, num_encoder_layers=1, num_decoder_layers=1, **kw)
            att = mod.decoder.layers[0].multihead_attn
        _randomize_biases(mod, gen)
        mod = mod.to(dev, dtype).train(cfg["mode"] == "train")
        b, lq, lk = cfg["batch"], cfg["tgt_len"], cfg["src_len"]
        src = torch.randn(b, lk, e, generator=gen, dtype=torch.float64).to(dev, dtype)
        tgt = torch.randn(b, lq, e, generator=gen, dtype=torch.float64).to(dev, dtype)
        causal = torch.ones(lq, lq, dtype=torch.bool, device=dev).triu(1)
        mod._kb_att = att
        return mod, {"src": src, "tgt": tgt, "causal": causal}

    def call(mod, i):
        _seed(cfg["seed"] + 2)
        if kind == "encoder_layer":
            return mod(i["src"])
        if kind.startswith("decoder_layer"):
            return mod(i["tgt"], i["src"], tgt_mask=i["causal"])
        return mod(i["src"], i["tgt"], tgt_mask=i["causal"])

    def run(mod, i):
        captured = {}

        def hook(module, args, kwargs, out):
            captured.setdefault("out", out[0])
            captured.setdefault("args", (args, kwargs))

        handle = mod._kb_att.register_forward_hook(hook, with_kwargs=True)
        try:
            whole = call(mod, i)
        finally:
            handle.remove()
        mod._kb_last = captured
        if "out" not in captured:
            raise RuntimeError("the attention module was bypassed (fused layer fast path)")
        return captured["out"], whole

    def stats(mod, i):
        run(mod, i)
        args, kwargs = mod._kb_last["args"]
        q, k, v = (list(args) + [kwargs.get(n) for n in ("query", "key", "value")])[:3]
        q, k, v = _mha_projections(mod._kb_att, q, k, v, True)
        return q, k, v, mod._kb_att.out_proj.weight.double(), k.shape[1]

    def grads(mod):
        g = mod._kb_att.in_proj_bias.grad
        return g.chunk(3) if g is not None else None

    return {"build": build, "run": run, "roles": lambda mod: _mha_roles(mod._kb_att), "stats": stats,
            "grads": grads}


def _sdpa_case(cfg: dict) -> dict:
    """F.scaled_dot_product_attention on projections computed here (no output projection)."""
    e, h, dev = cfg["embed_dim"], cfg["num_heads"], cfg["device"]

    def build(dtype):
        p = V.init_params(e, h, seed=cfg["seed"], dtype=dtype, device=dev)
        gen = torch.Generator().manual_seed(cfg["seed"] + 1)
        x = torch.randn(cfg["batch"], cfg["tgt_len"], e, generator=gen, dtype=torch.float64).to(dev, dtype)
        attn, _, causal = _masks(cfg, gen, dtype, dev)
        if causal:
            attn = None  # SDPA takes is_causal instead of an explicit mask
        if attn is not None and attn.dtype == torch.bool:
            attn = ~attn  # SDPA: True = take part
        return p, {"x": x, "attn_mask": attn, "is_causal": causal}

    def run(p, i):
        q, k, v = V.projections(i["x"], i["x"], p, num_heads=h)
        _seed(cfg["seed"] + 2)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=i["attn_mask"], dropout_p=cfg["dropout"], is_causal=i["is_causal"]
        )
        return out.transpose(1, 2).reshape(i["x"].shape)

    def stats(p, i):
        q, k, v = V.projections(i["x"].double(), i["x"].double(), {n: t.double() for n, t in p.items()}, num_heads=h)
        flat = [t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1) for t in (q, k, v)]
        return (*flat, None, flat[1].shape[1])

    return {"build": build, "run": run, "stats": stats, "grads": _param_grads,
            "roles": lambda p: {"b_q": [p["b_q"]], "b_k": [p["b_k"]], "b_v": [p["b_v"]]}}


def _param_grads(p):
    gs = [p[n].grad for n in ("b_q", "b_k", "b_v")]
    return None if any(g is None for g in gs) else gs


def _variant_case(cfg: dict) -> dict:
    e, h, var, dev = cfg["embed_dim"], cfg["num_heads"], cfg["variant"], cfg["device"]

    def build(dtype):
        p = V.init_params(e, h, variant=var, seed=cfg["seed"], dtype=dtype, device=dev)
        gen = torch.Generator().manual_seed(cfg["seed"] + 1)
        x = torch.randn(cfg["batch"], cfg["tgt_len"], e, generator=gen, dtype=torch.float64).to(dev, dtype)
        attn, _, _ = _masks(cfg, gen, dtype, dev)
        return p, {"x": x, "attn_mask": attn}

    def run(p, i):
        return V.attention(i["x"], i["x"], p, num_heads=h, variant=var, attn_mask=i["attn_mask"])

    def stats(p, i):
        p64 = {n: t.double() for n, t in p.items()}
        q, k, v = V.projections(i["x"].double(), i["x"].double(), p64, num_heads=h, variant=var)
        flat = [t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1) for t in (q, k, v)]
        return (*flat, p64["w_o"], flat[1].shape[1])

    def roles(p):
        r = {"b_q": [p["b_q"]], "b_k": [p["b_k"]], "b_v": [p["b_v"]]}
        if var == "sink_key":
            r["joint"] = [p["b_k"], p["sink_key"].view(-1)]
        return r

    return {"build": build, "run": run, "stats": stats, "roles": roles, "grads": _param_grads}


def _case(cfg: dict) -> dict:
    fam = cfg["family"]
    if fam in ("mha", "sizes"):
        return _mha_case(cfg)
    if fam == "layers":
        return _layer_case(cfg)
    if fam == "sdpa":
        return _sdpa_case(cfg)
    if fam == "variants":
        return _variant_case(cfg)
    if fam == "hf":
        from keybias.hf_attention import hf_case

        return hf_case(cfg)
    raise ValueError(f"family {fam!r} unknown; allowed: {list(FAMILIES)}")


# ----------------------------------------------------------------------------- measurement
def _nonfinite(cfg: dict, obj, base: torch.Tensor) -> dict:
    """Non-finite entries of the unperturbed output, and what a fully masked query row returns.

    The verdict compares only entries that are finite in both runs (a different non-finite pattern
    makes the change NaN), so a NaN row is excluded from it; this records how many there were.
    For mask `fully_masked_row` (query 0 sees no key; assumption A6 fails) `masked_row_output` is
    `nan` (the row is NaN), `out_proj_bias` (zero attention weights: the row equals the output
    projection's bias, which does not depend on b_k), `appended_slots` (add_bias_kv / add_zero_attn:
    MHA pads the mask with visible columns, so the row attends to the appended slots alone) or `other`."""
    out = {"nonfinite_outputs": int((~torch.isfinite(base)).sum()), "output_entries": int(base.numel()),
           "masked_row_output": ""}
    if cfg["mask"] == "fully_masked_row" and isinstance(obj, nn.MultiheadAttention):
        row = (base[:, 0] if cfg["batch_first"] else base[0]).detach().double()
        if not bool(torch.isfinite(row).any()):
            out["masked_row_output"] = "nan"
        elif obj.out_proj.bias is not None and torch.allclose(
            row, obj.out_proj.bias.detach().double().expand_as(row), rtol=0.0,
            atol=4 * VD.unit_roundoff(cfg["dtype"]) * float(row.abs().max() + 1.0),
        ):
            out["masked_row_output"] = "out_proj_bias"
        elif obj.bias_k is not None or obj.add_zero_attn:
            out["masked_row_output"] = "appended_slots"  # the padded mask leaves the appended slots visible
        else:
            out["masked_row_output"] = "other"
    return out


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _change(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over entries finite in both; nan if a non-finite pattern differs or none is finite."""
    a, b = a.double(), b.double()
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(fa, fb) or not bool(fa.any()):
        return math.nan
    return float((a[fa] - b[fa]).abs().max())


def _error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over entries finite in both (the rounding error of a against a reference b)."""
    a, b = a.double(), b.double()
    ok = torch.isfinite(a) & torch.isfinite(b)
    return float((a[ok] - b[ok]).abs().max()) if bool(ok.any()) else math.nan


@contextlib.contextmanager
def _perturbed(views: list, delta: torch.Tensor):
    saved = [v.clone() for v in views]
    with torch.no_grad():
        for v in views:
            v.add_(delta.to(v.dtype).reshape(v.shape))
    try:
        yield
    finally:
        with torch.no_grad():
            for v, s in zip(views, saved, strict=True):
                v.copy_(s)


def _tolerance(dtype, st: dict, n_slots: int, y_abs: float) -> float:
    return VD.output_tolerance(
        dtype, head_dim=st["head_dim"], n_keys=n_slots, score_abs_max=st["S"],
        value_abs_max=st["V_o"], out_dim=st["out_dim"], output_abs_max=y_abs,
    )


def _classify_all(deltas, tols, controls) -> str:
    verdicts = [VD.classify(d, t, control_delta=c) for d, t, c in zip(deltas, tols, controls, strict=True)]
    if VD.NOT_REDUNDANT in verdicts:
        return VD.NOT_REDUNDANT
    if VD.REDUNDANT in verdicts:
        return VD.REDUNDANT
    return VD.INVALID


def measure(cfg: dict, magnitudes) -> dict:
    """Measure one configuration; returns the row (config columns plus measurements)."""
    row = dict(cfg)
    dtype = _DT[cfg["dtype"]]
    case = _case(cfg)
    family = cfg["family"]
    with _mode(cfg):
        obj, inp = case["build"](dtype)
        roles = case["roles"](obj)
        if "b_k" not in roles:
            row.update(status="no_key_bias", reason="the module has no key bias (bias=False)",
                       verdict=VD.SKIPPED)
            return row
        log: list = []
        with _trace_paths(log):
            base = _first(case["run"](obj, inp))
        row["code_path"], row["sdpa_backend_used"] = _describe_path(log, family)
        row.update(_nonfinite(cfg, obj, base))
        if dtype == torch.float64:
            obj64, inp64, base64 = obj, inp, base
        else:
            obj64, inp64 = case["build"](torch.float64)
            base64 = _first(case["run"](obj64, inp64))
        roles64 = case["roles"](obj64)
        q, k, v, w_o, n_slots = case["stats"](obj64, inp64)
        st0 = _stats(q, k, v, w_o, cfg["num_heads"], cfg["dropout"] if cfg["mode"] == "train" else 0.0)
        typical = {"b_q": st0["norm_q"], "b_k": st0["norm_k"], "b_v": st0["norm_v"], "joint": st0["norm_k"]}
        y_abs = float(base.detach().double()[torch.isfinite(base)].abs().max()) if bool(torch.isfinite(base).any()) else math.nan
        y64_abs = float(base64.detach().abs().max())
        e_k = roles["b_k"][0].numel()
        low = dtype != torch.float64
        # the precision the kernels work in: float64 models whose eager softmax is float32 round at float32
        work, work64 = dtype, torch.float64
        if case.get("working_dtype"):
            work64 = _DT[case["working_dtype"]]
            if VD.unit_roundoff(case["working_dtype"]) > VD.unit_roundoff(dtype):
                work = work64
        err_base = _error(base, base64) if low else 0.0
        gen = torch.Generator().manual_seed(cfg["seed"] + 7)
        rec = {r: [] for r in roles}
        rec64 = {r: [] for r in roles}
        tols, tols64, bounds, tols_joint = [], [], [], []
        for mag in magnitudes:
            smax, err = {}, {}
            for r in roles:
                direction = torch.randn(e_k, generator=gen, dtype=torch.float64)
                delta = direction / direction.norm() * mag * typical[r]
                with _perturbed(roles64[r], delta):
                    y64 = _first(case["run"](obj64, inp64))
                    rec64[r].append(_change(y64, base64))
                    if r in ("b_k", "joint"):
                        st_m = _stats(*case["stats"](obj64, inp64)[:4], cfg["num_heads"])
                        smax[r] = max(st_m["S"], st0["S"])
                if low:
                    with _perturbed(roles[r], delta):
                        y = _first(case["run"](obj, inp))
                        rec[r].append(_change(y, base))
                        err[r] = _error(y, y64)
                else:
                    rec[r].append(rec64[r][-1])
            for r in smax:
                st = {**st0, "S": smax[r]}
                tol64 = _tolerance(work64, st, n_slots, y64_abs)
                bound = _tolerance(work, st, n_slots, y_abs)
                tol = VD.measured_tolerance(bound, error_base=err_base, error_perturbed=err[r],
                                            reference_tolerance=tol64) if low else bound
                if r == "b_k":
                    tols64.append(tol64)
                    bounds.append(bound)
                    tols.append(tol)
                else:
                    tols_joint.append(tol)
        # drop: b_k -> 0, judged like a perturbation (its own S, and measured errors below float64)
        drop = -roles64["b_k"][0].detach().double().cpu().clone()
        with _perturbed(roles64["b_k"], drop):
            y64 = _first(case["run"](obj64, inp64))
            st_d = {**st0, "S": max(_stats(*case["stats"](obj64, inp64)[:4], cfg["num_heads"])["S"], st0["S"])}
        with _perturbed(roles["b_k"], drop):
            y = _first(case["run"](obj, inp))
            d_drop = _change(y, base)
            err_drop = _error(y, y64) if low else 0.0
        tol_drop = _tolerance(work, st_d, n_slots, y_abs)
        if low:
            tol_drop = VD.measured_tolerance(tol_drop, error_base=err_base, error_perturbed=err_drop,
                                             reference_tolerance=_tolerance(work64, st_d, n_slots, y64_abs))
    controls = [min(a, b) for a, b in zip(rec["b_q"], rec["b_v"], strict=True)]
    # the drop is a perturbation of size |b_k|: its control is the one at the nearest magnitude
    drop_mag = float(drop.norm()) / typical["b_k"] if typical["b_k"] > 0 else 1.0
    drop_index = min(range(len(magnitudes)),
                     key=lambda i: abs(math.log(magnitudes[i]) - math.log(max(drop_mag, 1e-30))))
    controls64 = [min(a, b) for a, b in zip(rec64["b_q"], rec64["b_v"], strict=True)]
    rel = (lambda x: x / y_abs) if y_abs and math.isfinite(y_abs) else (lambda x: math.nan)
    finite = [x for x in rec["b_k"] if math.isfinite(x)]
    row.update(
        status="measured", reason="", n_slots=n_slots, head_dim=st0["head_dim"],
        typical_key_norm=st0["norm_k"], output_abs_max=y_abs,
        max_abs_bk=max(finite) if finite else math.nan,
        max_rel_bk=rel(max(finite)) if finite else math.nan,
        max_rel_bq=rel(max(rec["b_q"])), max_rel_bv=rel(max(rec["b_v"])),
        min_rel_control=rel(min(controls)),
        tolerance_abs=max(tols), tolerance_rel=rel(max(tols)), bound_rel=rel(max(bounds)),
        error_base_rel=rel(err_base), working_dtype=str(work).removeprefix("torch."),
        bk_over_tol=max((d / t for d, t in zip(rec["b_k"], tols, strict=True) if math.isfinite(d)), default=math.nan),
        control_over_tol=min(c / t for c, t in zip(controls, tols, strict=True)),
        bk_rel_over_u=rel(max(finite)) / VD.unit_roundoff(dtype) if finite else math.nan,
        noise_floor_rel=max(rec64["b_k"]) / y64_abs,
        noise_floor_over_u64=max(rec64["b_k"]) / y64_abs / VD.unit_roundoff("float64"),
        max_rel_drop=rel(d_drop),
        verdict=_classify_all(rec["b_k"], tols, controls),
        verdict_float64=_classify_all(rec64["b_k"], tols64, controls64),
        noise_floor_over_tol64=max(d / t for d, t in zip(rec64["b_k"], tols64, strict=True)),
        drop_verdict=VD.classify(d_drop, tol_drop, control_delta=controls[drop_index]),
    )
    if "joint" in rec:
        row["max_rel_joint"] = rel(max(rec["joint"]))
        row["verdict_joint"] = _classify_all(rec["joint"], tols_joint, controls)
    if family == "layers":
        row["code_path"] = row["code_path"] + "(layer)"
    try:
        row.update(_gradient(cfg, case, dtype, st0, n_slots, work))
    except Exception as exc:  # noqa: BLE001 - e.g. a backward PyTorch does not implement
        row.update(grad_verdict=VD.SKIPPED, grad_reason=f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
    return row


def _gradient(cfg: dict, case: dict, dtype, st: dict, n_slots: int, work) -> dict:
    """One backward pass (grad enabled, so never the fused fast path)."""
    with _mode(cfg, grad=True):
        obj, inp = case["build"](dtype)
        if isinstance(obj, dict):
            for t in obj.values():
                t.requires_grad_(True)
        out = _first(case["run"](obj, inp))
        gen = torch.Generator().manual_seed(cfg["seed"] + 11)
        upstream = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.device, out.dtype)
        finite = torch.isfinite(out)
        (out.where(finite, torch.zeros_like(out)) * upstream).sum().backward()
        grads = case["grads"](obj)
    if grads is None:
        return {"grad_verdict": VD.INVALID}
    gq, gk, gv = (float(g.double().abs().max()) for g in grads)
    m = out.numel() // out.shape[-1]
    tol = VD.gradient_tolerance(
        work, head_dim=st["head_dim"], n_queries=m, n_keys=n_slots, query_abs_max=st["Q"],
        value_abs_max=st["V_g"], upstream_abs_max=float(upstream.double().abs().max()),
    )
    ctrl = max(gq, gv)
    return {
        "grad_bk": gk, "grad_bq": gq, "grad_bv": gv,
        "grad_ratio": gk / ctrl if ctrl > 0 else math.nan, "grad_tolerance": tol,
        "grad_verdict": VD.classify(gk, tol, control_delta=min(gq, gv)),
    }


def _rejected_row(cfg: dict, exc: Exception) -> dict:
    msg = " ".join(str(exc).split())[:300]
    return {**cfg, "status": "rejected", "reason": f"{type(exc).__name__}: {msg}", "verdict": VD.SKIPPED}


def expected_verdict(row: dict) -> tuple[str, str]:
    """What the proof predicts for a configuration, and which assumption decides it."""
    fam, var = row.get("family"), row.get("variant")
    if row.get("status") != "measured":
        return VD.SKIPPED, row.get("reason", "")
    if fam == "variants" and var in ("sigmoid",):
        return VD.NOT_REDUNDANT, V.DROP_IS_EXACT[var][1]
    if row.get("n_slots") == 1:
        return VD.INVALID, "a single key: softmax over one slot is 1, no score (b_q nor b_k) matters"
    if fam == "variants":
        exact, why = V.DROP_IS_EXACT[var]
        return (VD.REDUNDANT if exact else VD.NOT_REDUNDANT), why
    if fam == "hf":
        from keybias.hf_attention import EXPECTED

        return EXPECTED[var]
    if (row.get("add_zero_attn") or row.get("add_bias_kv")) and row.get("mask") == "is_causal" and not row.get("need_weights"):
        return VD.REDUNDANT, ("is_causal=True, need_weights=False: MHA hands is_causal to SDPA instead of the padded "
                              "attn_mask, and SDPA's causal mask hides the appended slots, so every visible slot shifts")
    if row.get("add_zero_attn"):
        return VD.NOT_REDUNDANT, "(A1) the zero key slot appended by add_zero_attn is not projected: its score stays 0"
    if row.get("add_bias_kv"):
        return VD.NOT_REDUNDANT, "(A1) the extra key bias_k is not projected, so its score misses q.b_k (exact jointly with bias_k += delta)"
    return VD.REDUNDANT, "all slots shifted by q.b_k; softmax is shift invariant"


def run_sweep(configs: list[dict], magnitudes, *, progress: bool = True) -> pd.DataFrame:
    """Measure every configuration; rejected ones and absent devices become `skipped` rows."""
    magnitudes = [float(m) for m in magnitudes]
    if not magnitudes or any(not (m > 0 and math.isfinite(m)) for m in magnitudes):
        raise ValueError(f"magnitudes must be positive finite numbers, got {magnitudes!r}")
    rows = []
    threads = torch.get_num_threads()
    for cfg in tqdm(configs, desc="invariance sweep", disable=not progress, mininterval=1.0):
        start = time.perf_counter()
        # tiny problems run faster on one thread (no pool wake-ups); large ones use them all
        big = cfg["embed_dim"] * max(cfg["tgt_len"], cfg["src_len"]) * cfg["batch"] >= 65536
        torch.set_num_threads(threads if big else 1)
        if cfg["family"] == "device":
            row = {**cfg, "status": "absent_device", "verdict": VD.SKIPPED,
                   "reason": f"device {cfg['device']!r} not present on this machine (torch reports it unavailable)"}
        else:
            try:
                row = measure(cfg, magnitudes)
            except Exception as exc:  # noqa: BLE001 - PyTorch's own rejection is the result
                row = _rejected_row(cfg, exc)
        row["expected"], row["assumption"] = expected_verdict(row)
        row["kdim"] = cfg["kdim"] or cfg["embed_dim"]
        row["vdim"] = cfg["vdim"] or cfg["embed_dim"]
        row["training"] = cfg["mode"] == "train"
        row["grad_enabled"] = cfg["mode"] in ("train", "eval")
        row["fastpath_enabled"] = cfg["mode"] != "inference_no_fastpath"
        row["seconds"] = time.perf_counter() - start
        rows.append(row)
    torch.set_num_threads(threads)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- summaries
def category(row) -> str:
    """Short label (option / variant / family) used by the figure and table."""
    fam = row["family"]
    if fam == "mha":
        if "single key" in row["case"]:
            return row["case"]
        if row["mask"] == "fully_masked_row":
            return "MHA fully masked row"
        if row["case"] == "MHA shapes":
            return "MHA shapes"
        return f"MHA {row['option']}"
    if fam == "hf":
        return f"HF {row['variant']}"
    return row["case"]


def verdict_table(df: pd.DataFrame) -> pd.DataFrame:
    """Counts of verdicts per category, with the prediction and (for breaks) the assumption."""
    d = df.assign(category=df.apply(category, axis=1))
    counts = d.pivot_table(index="category", columns="verdict", values="seed", aggfunc="count", fill_value=0)
    for v in (VD.REDUNDANT, VD.NOT_REDUNDANT, VD.INVALID, VD.SKIPPED):
        if v not in counts:
            counts[v] = 0
    counts = counts[[VD.REDUNDANT, VD.NOT_REDUNDANT, VD.INVALID, VD.SKIPPED]]
    measured = d[d.status == "measured"]
    agree = measured.groupby("category").apply(lambda g: int((g.verdict == g.expected).sum()), include_groups=False)
    n = measured.groupby("category").size()
    joint = d.groupby("category")["verdict_joint"].agg(lambda s: ",".join(sorted(set(s.dropna())))) if "verdict_joint" in d else None
    out = counts.reset_index()
    out["matches_theory"] = [f"{agree.get(c, 0)}/{n.get(c, 0)}" for c in out["category"]]
    if joint is not None:
        out["joint"] = [joint.get(c, "") or "--" for c in out["category"]]
    return out


TARGET_CONFIGS = 2000  # the issue: the paper profile verifies at least this many configurations ...
TARGET_SECONDS = 120.0  # ... within two minutes
HIGH_PRECISION = ("float32", "float64")
# breaking (and a few redundant) categories whose smallest/largest relative change the paper prints
CATEGORY_MACROS = {"MHA add_zero_attn": "ZeroAttn", "MHA add_bias_kv": "BiasKv", "variant rope": "Rope",
                   "variant qk_norm": "QkNorm", "variant cosine": "Cosine", "variant sigmoid": "Sigmoid",
                   "variant sink_logit": "SinkLogit", "variant sink_key": "SinkKey", "HF qwen2": "Qwen",
                   "MHA plain": "Plain", "variant alibi": "Alibi", "HF bert": "Bert"}


def expected_measurable(configs: list[dict]) -> int:
    """A lower bound on how many configurations will be measured (not skipped), from the
    configurations alone: it leaves out absent devices, bias=False (no b_k), MHA's is_causal
    without a mask (PyTorch refuses it) and every SDPA backend but MATH on the CPU (the fused CPU
    kernels accept only some dtypes and masks; counting none of them keeps this a lower bound)."""
    def skipped(c: dict) -> bool:
        return (c["family"] == "device" or not c["bias"]
                or (c["family"] == "mha" and c["mask"] == "is_causal_only")
                or (c["family"] == "sdpa" and c["device"] == "cpu" and c["sdpa_backend"] != "MATH"))
    return sum(not skipped(c) for c in configs)


def config_target(configs: list[dict], profile: str) -> int:
    """The bound of the configuration-count claim: the issue's TARGET_CONFIGS for the paper
    profile, else the profile's own `expected_measurable` count."""
    return TARGET_CONFIGS if profile == "paper" else expected_measurable(configs)


def summary(df: pd.DataFrame) -> dict:
    """Headline numbers for macros and claims (`configs` counts measured rows, `total` all rows)."""
    m = df[df.status == "measured"]
    valid = m[m.verdict != VD.INVALID]
    both = m[(m.verdict != VD.INVALID) & (m.grad_verdict.isin([VD.REDUNDANT, VD.NOT_REDUNDANT]))]
    red = m[m.verdict == VD.REDUNDANT]
    nred = m[m.verdict == VD.NOT_REDUNDANT]
    masked = m[m["mask"] == "fully_masked_row"] if "mask" in m else m.iloc[:0]
    col = (lambda d, c: d[c] if c in d else pd.Series("", index=d.index))  # noqa: E731
    return {
        "configs": len(m),
        "total": len(df),
        "measured": len(m),
        "rejected": int((df.status == "rejected").sum()),
        "skipped": int((df.verdict == VD.SKIPPED).sum()),
        "redundant": len(red),
        "not_redundant": len(nred),
        "invalid": int((m.verdict == VD.INVALID).sum()),
        "mismatches": int((valid.verdict != valid.expected).sum()),
        "unexpected_invalid": int(((m.verdict == VD.INVALID) & (m.expected != VD.INVALID)).sum()),
        "invalid_low_precision": int(((m.verdict == VD.INVALID) & m.dtype.isin(["bfloat16", "float16"])).sum()),
        "grad_disagree": int((both.verdict != both.grad_verdict).sum()),
        "max_bk_over_tol_redundant": float(red.bk_over_tol.max()) if len(red) else math.nan,
        "min_bk_over_tol_not_redundant": float(nred.bk_over_tol.min()) if len(nred) else math.nan,
        "min_control_over_tol": float(valid.control_over_tol.min()) if len(valid) else math.nan,
        "max_noise_floor_over_u64": float(m.noise_floor_over_u64.max()) if len(m) else math.nan,
        "fast_path_rows": int((m.code_path == "mha_fast_path").sum()),
        "masked_rows": len(masked),
        "masked_row_nan": int((col(masked, "masked_row_output") == "nan").sum()),
        "masked_row_bias": int((col(masked, "masked_row_output") == "out_proj_bias").sum()),
        "masked_row_appended": int((col(masked, "masked_row_output") == "appended_slots").sum()),
        "nonfinite_other": int(((col(m, "nonfinite_outputs").fillna(0).astype(float) > 0)
                                & (m["mask"] != "fully_masked_row")).sum()) if len(m) else 0,
    }


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower()).strip("-")


def invariance_claims(df: pd.DataFrame, *, seconds: float, min_configs: int) -> dict:
    """Claims and macros of the sweep.

    Returns {"claims": [(id, statement, value, bound, comparison)], "macros": {name: value},
    "skipped": [(id, reason)]}. A claim whose checked set is empty is not recorded but listed in
    `skipped` with the reason (a count of mismatches over nothing would pass without data); the
    float64 noise-floor claim takes NaN (so it fails) if no row is predicted redundant."""
    if not seconds > 0:
        raise ValueError(f"seconds must be positive, got {seconds!r}")
    s = summary(df)
    m = df[df.status == "measured"].assign(category=lambda d: d.apply(category, axis=1))
    valid = m[m.verdict != VD.INVALID]
    claims, skipped = [], []
    rate = s["configs"] / seconds

    def mismatch_claim(cid, statement, rows, ok):
        if len(rows):
            claims.append((cid, statement, int((~ok).sum()), 0, "<="))
        else:
            skipped.append((cid, "this profile has no such configurations"))

    mismatch_claim("invariance-matches-theory",
                   f"Every one of the {len(valid):,} valid configurations' measured verdict equals the proof's prediction.",
                   valid, valid.verdict == valid.expected)
    for cat, rows in valid.groupby("category"):
        n_red = int((rows.expected == VD.REDUNDANT).sum())
        n_not = int((rows.expected == VD.NOT_REDUNDANT).sum())
        text = (f"{cat}: the verdicts match the proof's prediction in all {len(rows)} valid configurations "
                f"({n_red} expected redundant, {n_not} expected not redundant).")
        if cat == "MHA fully masked row":
            nan = int((rows.get("masked_row_output", pd.Series(dtype=str)) == "nan").sum())
            text += (f" In {nan} of them PyTorch returns NaN for the fully masked query row, which the "
                     "verdict leaves out; it judges the rows that see a key.")
        mismatch_claim(f"invariance-{_slug(cat)}", text, rows, rows.verdict == rows.expected)
    if "verdict_joint" in m:
        joint = m[m.option.eq("add_bias_kv") & m.verdict_joint.notna()]
        joint = joint[joint.verdict_joint != VD.INVALID]
        mismatch_claim("invariance-add-bias-kv-joint-redundant",
                       "With add_bias_kv, b_k is redundant jointly with bias_k (shifting both by the same vector).",
                       joint, joint.verdict_joint == VD.REDUNDANT)
    else:
        skipped.append(("invariance-add-bias-kv-joint-redundant", "no add_bias_kv configuration"))
    single = m[m.case == "MHA single key plain"]
    mismatch_claim("invariance-single-key-no-power",
                   "With a single key, neither b_k nor the b_q control changes the output: the test has no power.",
                   single, single.verdict == VD.INVALID)
    masked = m[m["mask"] == "fully_masked_row"]
    mo = masked["masked_row_output"] if "masked_row_output" in masked else pd.Series("", index=masked.index)
    mismatch_claim("invariance-fully-masked-row-output",
                   "For a fully masked query row PyTorch returns NaN, or the output projection's bias (zero "
                   "attention weights), or, with add_bias_kv/add_zero_attn, attention over the appended slots alone.",
                   masked, mo.isin(["nan", "out_proj_bias"])
                   | ((mo == "appended_slots") & (masked.add_bias_kv | masked.add_zero_attn)))
    drops = m[m.drop_verdict.isin([VD.REDUNDANT, VD.NOT_REDUNDANT]) & m.expected.isin([VD.REDUNDANT, VD.NOT_REDUNDANT])]
    drops_high = drops[drops.dtype.isin(HIGH_PRECISION)]
    drops_low = drops[~drops.dtype.isin(HIGH_PRECISION)]
    mismatch_claim("invariance-drop-matches-theory",
                   "In float32 and float64, setting b_k to zero is exact exactly where the proof predicts "
                   "redundancy, and changes the function elsewhere.",
                   drops_high, drops_high.drop_verdict == drops_high.expected)
    mismatch_claim("invariance-drop-never-breaks-redundant",
                   "In no dtype does setting b_k to zero change the output beyond rounding where the proof "
                   "predicts redundancy.",
                   drops, ~((drops.expected == VD.REDUNDANT) & (drops.drop_verdict == VD.NOT_REDUNDANT)))
    red64 = m[m.expected == VD.REDUNDANT]
    claims.append(("invariance-float64-noise-floor",
                   "Where the proof applies, the float64 change caused by b_k stays within the float64 tolerance.",
                   float(red64.noise_floor_over_tol64.max()) if len(red64) else math.nan, 1.0, "<="))
    both = m[(m.verdict != VD.INVALID) & m.grad_verdict.isin([VD.REDUNDANT, VD.NOT_REDUNDANT])]
    high = both[both.dtype.isin(HIGH_PRECISION)]
    low = both[~both.dtype.isin(HIGH_PRECISION)]
    mismatch_claim("invariance-gradient-agrees",
                   "In float32 and float64, the b_k gradient verdict agrees with the output verdict wherever both have power.",
                   high, high.verdict == high.grad_verdict)
    mismatch_claim("invariance-gradient-never-contradicts",
                   "No configuration whose output is redundant has a b_k gradient above its rounding bound.",
                   both, ~((both.verdict == VD.REDUNDANT) & (both.grad_verdict == VD.NOT_REDUNDANT)))
    claims.append(("invariance-sweep-time",
                   f"The sweep measures {s['configs']:,} configurations at {rate:.0f} per second, within two minutes.",
                   float(seconds), TARGET_SECONDS, "<="))
    claims.append(("invariance-config-count",
                   f"The sweep measures (does not skip) at least {min_configs:,} configurations.",
                   s["configs"], min_configs, ">="))

    macros = {
        "InvConfigCount": s["configs"], "InvConfigTotal": s["total"], "InvMeasured": s["measured"],
        "InvRejected": s["rejected"], "InvSkipped": s["skipped"], "InvRedundant": s["redundant"],
        "InvNotRedundant": s["not_redundant"], "InvInvalid": s["invalid"], "InvMismatches": s["mismatches"],
        "InvFastPathRows": s["fast_path_rows"], "InvInvalidLowPrecision": s["invalid_low_precision"],
        "InvGradDisagree": s["grad_disagree"], "InvConfigsPerSecond": rate, "InvSweepSeconds": float(seconds),
        "InvMaxRedundantOverTol": s["max_bk_over_tol_redundant"],
        "InvMinNotRedundantOverTol": s["min_bk_over_tol_not_redundant"],
        "InvMaskedRows": s["masked_rows"], "InvMaskedRowNan": s["masked_row_nan"],
        "InvMaskedRowBias": s["masked_row_bias"], "InvMaskedRowAppended": s["masked_row_appended"], "InvNonfiniteOther": s["nonfinite_other"],
        "InvDtypeCount": int(m.dtype.nunique()),
        "InvEmbedMin": int(m.embed_dim.min()) if len(m) else "n/a",
        "InvEmbedMax": int(m.embed_dim.max()) if len(m) else "n/a",
        "InvKeysMin": int(m.src_len.min()) if len(m) else "n/a",
        "InvKeysMax": int(m.src_len.max()) if len(m) else "n/a",
        "InvVariantCount": int(m[(m.family == "variants") & (m.variant != "softmax")].variant.nunique()),
        "InvFamilyCount": int(m[m.family == "hf"].variant.nunique()),
        "InvDropRows": len(drops_high),
        "InvDropBelowResolution": int(((drops_low.expected == VD.NOT_REDUNDANT)
                                       & (drops_low.drop_verdict == VD.REDUNDANT)).sum()),
        "InvGradLowPrecisionMissed": int(((low.verdict == VD.NOT_REDUNDANT) & (low.grad_verdict == VD.REDUNDANT)).sum()),
    }
    for cat, short in CATEGORY_MACROS.items():
        rows = m[(m.category == cat) & (m.verdict != VD.INVALID)]
        macros[f"Inv{short}MinRel"] = float(rows.max_rel_bk.min()) if len(rows) else "n/a"
        macros[f"Inv{short}MaxRel"] = float(rows.max_rel_bk.max()) if len(rows) else "n/a"
        macros[f"Inv{short}Rows"] = len(rows)
    return {"claims": claims, "macros": macros, "skipped": skipped}


def breaks_table(df: pd.DataFrame) -> pd.DataFrame:
    """Every measured not_redundant row counted by category and the assumption of the proof it violates."""
    m = df[(df.status == "measured") & (df.verdict == VD.NOT_REDUNDANT)]
    if not len(m):
        return pd.DataFrame(columns=["category", "assumption", "rows"])
    m = m.assign(category=m.apply(category, axis=1))
    return m.groupby(["category", "assumption"]).size().rename("rows").reset_index()


def code_paths(df: pd.DataFrame) -> pd.DataFrame:
    """Measured rows by family, code path that ran and SDPA backend used."""
    m = df[df.status == "measured"]
    return m.groupby(["family", "code_path", "sdpa_backend_used"]).size().rename("rows").reset_index()


def rejections(df: pd.DataFrame) -> pd.DataFrame:
    """Skipped rows by status and reason (PyTorch's message, no b_k, absent device)."""
    s = df[df.status != "measured"]
    return s.groupby(["status", "reason"]).size().rename("rows").reset_index()


def plot_map(df: pd.DataFrame):
    """The invariance map: log10 relative output change from b_k (coloured by verdict) against
    the b_q/b_v control, the verdict's tolerance and the float64 noise floor, per category and dtype."""
    import matplotlib.pyplot as plt
    import numpy as np

    m = df[df.status == "measured"].copy()
    m["category"] = m.apply(category, axis=1)
    cats = sorted(m["category"].unique())
    dts = [d for d in DTYPES if d in set(m.dtype)]
    colors = {VD.REDUNDANT: "tab:blue", VD.NOT_REDUNDANT: "tab:red", VD.INVALID: "tab:gray"}
    fig, axes = plt.subplots(1, len(dts), figsize=(3.0 * len(dts) + 2.5, 0.28 * len(cats) + 1.6),
                             sharey=True, squeeze=False)
    floor = 1e-20
    lg = lambda s: np.log10(np.clip(s.astype(float).to_numpy(), floor, None))  # noqa: E731
    for ax, dt in zip(axes[0], dts, strict=True):
        sub = m[m.dtype == dt]
        y = sub["category"].map({c: i for i, c in enumerate(cats)}).to_numpy()
        jitter = (np.random.default_rng(0).random(len(sub)) - 0.5) * 0.35
        ax.scatter(lg(sub.tolerance_rel), y, marker="|", s=60, color="black", lw=0.8, label="tolerance")
        ax.scatter(lg(sub.noise_floor_rel), y + jitter, marker=".", s=6, color="tab:olive", label="b_k in float64")
        ax.scatter(lg(sub.min_rel_control), y + jitter, marker="^", s=10, color="tab:orange", alpha=0.6,
                   label="control (b_q, b_v)")
        for v, c in colors.items():
            sel = (sub.verdict == v).to_numpy()
            ax.scatter(lg(sub.max_rel_bk)[sel], (y + jitter)[sel], s=10, color=c, alpha=0.7, label=f"b_k: {v}")
        ax.set_title(dt)
        ax.set_xlabel("log10 relative change")
        ax.set_xlim(-20, 3)
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(range(len(cats)), cats, fontsize=7)
    axes[0][0].invert_yaxis()
    handles, labels = axes[0][0].get_legend_handles_labels()
    uniq = dict(zip(labels, handles, strict=True))
    fig.legend(uniq.values(), uniq.keys(), loc="lower center", ncol=6, fontsize=7, frameon=False,
               bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def verdict_latex(table: pd.DataFrame) -> str:
    """booktabs tabular of `verdict_table`."""
    cols = [c for c in table.columns]
    head = {"category": "configuration", "redundant": "red.", "not_redundant": "not red.",
            "invalid": "inval.", "skipped": "skip.", "matches_theory": "as predicted", "joint": "joint"}
    esc = lambda t: str(t).replace("_", r"\_").replace("&", r"\&")  # noqa: E731
    lines = [r"\begin{tabular}{l" + "r" * (len(cols) - 1) + "}", r"\toprule",
             " & ".join(esc(head.get(c, c)) for c in cols) + r" \\", r"\midrule"]
    for _, r in table.iterrows():
        lines.append(" & ".join(esc(r[c]) for c in cols) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"
