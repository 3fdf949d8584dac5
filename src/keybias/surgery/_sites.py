"""Finding attention modules by their structure, and deciding per family whether b_k is redundant.

A module is attention-like when it has query/key/value projections under any of the known
names, a packed q/k/v projection (GPT-2's `c_attn`, nn.MultiheadAttention's `in_proj`), or a
class name or forward that says so (a call of scaled_dot_product_attention). Only classes whose
function this package has verified are changed; every other attention-like module is listed
with the structural reason it was left alone.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field

from torch import nn

# Separate projections, named (query, key, value).
TRIPLES = (
    ("query", "key", "value"),
    ("q_proj", "k_proj", "v_proj"),
    ("q_lin", "k_lin", "v_lin"),
    ("linear_Q", "linear_K", "linear_V"),
    ("query_proj", "key_proj", "value_proj"),
    ("q", "k", "v"),
)
OWN_OUTPUTS = ("o_proj", "out_proj", "out_lin", "c_proj", "o")
# Classes whose function is softmax(q k^T * scale + additive mask) v followed by an output
# projection, with no position term that touches the key: verified here and in the tests.
# A subclass of one of them (a model that reuses the class) is handled the same way.
VERIFIED = {
    "BertSelfAttention": "BERT",
    "BertCrossAttention": "BERT",
    "RobertaSelfAttention": "RoBERTa",
    "RobertaCrossAttention": "RoBERTa",
    "ElectraSelfAttention": "ELECTRA",
    "ElectraCrossAttention": "ELECTRA",
    "DistilBertSelfAttention": "DistilBERT",
    "ViTAttention": "ViT",
    "CLIPAttention": "CLIP",
    "BartAttention": "BART",
    "WhisperAttention": "Whisper",
    "GPT2Attention": "GPT-2",
}
DEBERTA = ("DisentangledSelfAttention",)
_ATTENTION_NAME = re.compile(r"attention|attn", re.IGNORECASE)


@dataclass
class Slot:
    """A bias vector: attribute `name` of the submodule `owner` (relative to the unit), whole
    or the entries start:stop of a packed vector."""

    owner: str
    name: str
    start: int | None = None
    stop: int | None = None

    def describe(self, unit_path: str) -> str:
        base = ".".join(p for p in (unit_path, self.owner, self.name) if p)
        return base if self.start is None else f"{base}[{self.start}:{self.stop}]"


@dataclass
class Site:
    """One attention module and where its b_k, b_v and output projection live.

    `unit` is the module whose forward is certified: the attention module itself, or its
    parent when the output projection lives there (BERT's `output.dense`). Slot owners are
    paths relative to the unit, so the same Site acts on a copy of the unit."""

    path: str
    unit_path: str
    family: str
    layout: str  # mha | triple | packed
    key: Slot | None = None
    value: Slot | None = None
    out: str | None = None  # output projection, relative to the unit
    out_transposed: bool = False  # Conv1D stores W_o as (in, out)
    key_partner: Slot | None = None  # add_bias_kv's extra key slot
    value_partner: Slot | None = None
    projections: tuple[str, ...] = ()  # q, k, v modules relative to the unit (hooked to measure)
    heads: int = 1
    dropout: float = 0.0
    refuse_strip: str | None = None
    refuse_fold: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path or "<root>"


def _mro_names(module: nn.Module) -> list[str]:
    return [c.__name__ for c in type(module).__mro__]


def verified_family(module: nn.Module) -> str | None:
    for name in _mro_names(module):
        if name in VERIFIED:
            return VERIFIED[name]
    return None


def _is_projection(module) -> bool:
    weight = getattr(module, "weight", None)
    return isinstance(module, nn.Module) and weight is not None and getattr(weight, "ndim", 0) == 2


def _triple(module: nn.Module) -> tuple[str, str, str] | None:
    children = dict(module.named_children())
    for names in TRIPLES:
        if all(_is_projection(children.get(n)) for n in names):
            return names
    return None


_SDPA_CACHE: dict[type, bool] = {}


def _calls_sdpa(module: nn.Module) -> bool:
    cls = type(module)
    if cls not in _SDPA_CACHE:
        try:
            source = inspect.getsource(cls.forward)
        except (OSError, TypeError):
            source = ""
        _SDPA_CACHE[cls] = "scaled_dot_product_attention" in source or "attention_interface" in source
    return _SDPA_CACHE[cls]


def _heads(module: nn.Module, config) -> int:
    for obj in (module, config):
        for attr in ("num_heads", "num_attention_heads", "n_heads", "n_head", "encoder_attention_heads"):
            value = getattr(obj, attr, None)
            if isinstance(value, int) and value > 0:
                return value
    return 1


def _rotary_reason(module: nn.Module) -> str | None:
    names = {n for n, _ in module.named_children()}
    try:
        params = inspect.signature(type(module).forward).parameters
    except (TypeError, ValueError):
        params = {}
    if "position_embeddings" in params or any("rotary" in n for n in names) or hasattr(module, "rotary_emb"):
        return ("rotary position embeddings (RoPE) rotate each key by its position after b_k is added, "
                "so the score term q_i . R_j b_k depends on the key position j and is not a row constant")
    return None


def _qk_norm_reason(module: nn.Module) -> str | None:
    names = {n for n, _ in module.named_children()}
    if {"q_norm", "k_norm"} & names or {"q_layernorm", "k_layernorm"} & names:
        return ("QK-norm normalizes each key after b_k is added, so b_k does not shift the scores "
                "by a row constant")
    return None


def _position_reason(module: nn.Module) -> str | None:
    config = getattr(module, "config", None)
    pos = getattr(module, "position_embedding_type", getattr(config, "position_embedding_type", None))
    if pos == "relative_key_query":
        return ("position_embedding_type='relative_key_query' adds k_j . r_(i-j), a score term in which "
                "b_k . r_(i-j) depends on the key position j")
    return None


def _deberta_reason(module: nn.Module) -> str:
    config = getattr(module, "config", None)
    kinds = getattr(module, "pos_att_type", None) or getattr(config, "pos_att_type", None) or ()
    relative = getattr(module, "relative_attention", getattr(config, "relative_attention", False))
    if relative and "p2c" in kinds:
        return ("DeBERTa-v2 disentangled attention: its position-to-content term k_j . r_q(j - i) "
                "contains b_k . r_q(j - i), which depends on the key position j")
    return ("DeBERTa-v2 disentangled attention: not verified by this tool (its relative terms scale "
            "and mix scores per position); left as is")


def _unknown_reason(module: nn.Module) -> str:
    for reason in (_rotary_reason(module), _qk_norm_reason(module), _position_reason(module)):
        if reason:
            return f"unknown attention class; {reason}"
    return ("unknown attention class: its function has not been verified, so its key bias was left "
            "as is")


def _dropout(module: nn.Module) -> float:
    for attr in ("dropout", "attn_dropout", "attention_dropout"):
        value = getattr(module, attr, None)
        if isinstance(value, nn.Dropout):
            return float(value.p)
        if isinstance(value, float):
            return value
    return 0.0


def _mha_site(path: str, module: nn.MultiheadAttention) -> Site:
    e = module.embed_dim
    quantizable = all(_is_projection(getattr(module, n, None)) for n in ("linear_Q", "linear_K", "linear_V"))
    site = Site(path=path, unit_path=path, family="torch.ao quantizable MHA" if quantizable else "nn.MultiheadAttention",
                layout="triple" if quantizable else "mha", out="out_proj", heads=module.num_heads,
                dropout=float(module.dropout))
    if quantizable:
        site.projections = ("linear_Q", "linear_K", "linear_V")
        if module.linear_K.bias is not None:
            site.key = Slot("linear_K", "bias")
        if module.linear_V.bias is not None:
            site.value = Slot("linear_V", "bias")
    elif module.in_proj_bias is not None:
        site.key = Slot("", "in_proj_bias", e, 2 * e)
        site.value = Slot("", "in_proj_bias", 2 * e, 3 * e)
    if module.bias_k is not None:
        site.key_partner = Slot("", "bias_k")
        site.value_partner = Slot("", "bias_v")
    if module.add_zero_attn and site.key is not None:
        site.refuse_strip = ("add_zero_attn=True appends a zero key that gets no b_k, so removing b_k "
                             "changes the scores of the real keys but not of the zero key")
    if module.add_zero_attn and site.value is not None:
        site.refuse_fold = ("add_zero_attn=True appends a zero value that gets no b_v, so the weighted "
                            "sum of values does not shift by b_v")
    if module.out_proj.bias is None and site.value is not None:
        site.refuse_fold = site.refuse_fold or "out_proj has no bias to fold b_v into"
    return site


def _hf_site(model: nn.Module, path: str, module: nn.Module, family: str, names) -> Site | None:
    config = getattr(module, "config", None)
    own = next((n for n in OWN_OUTPUTS if _is_projection(getattr(module, n, None))), None)
    if own is not None:
        unit_path, prefix, out = path, "", own
    else:
        parent_path = path.rpartition(".")[0] if "." in path else ""
        if not path:
            return None
        parent = model.get_submodule(parent_path)
        dense = getattr(getattr(parent, "output", None), "dense", None)
        if not _is_projection(dense):
            return None
        unit_path, prefix, out = parent_path, path.rpartition(".")[2] + ".", "output.dense"
    k, v = getattr(module, names[1]), getattr(module, names[2])
    site = Site(path=path, unit_path=unit_path, family=family, layout="triple", out=out,
                projections=tuple(prefix + n for n in names), heads=_heads(module, config),
                dropout=_dropout(module))
    if k.bias is not None:
        site.key = Slot(prefix + names[1], "bias")
    else:
        site.notes.append(f"{names[1]} has no bias")
    if v.bias is not None:
        site.value = Slot(prefix + names[2], "bias")
    out_module = module.get_submodule(out) if own else model.get_submodule(unit_path).get_submodule(out)
    if out_module.bias is None:
        site.refuse_fold = "the output projection has no bias to fold b_v into"
    reason = _position_reason(module)
    if reason:
        site.refuse_strip = site.refuse_fold = reason
    return site


def _gpt2_site(path: str, module: nn.Module) -> Site:
    cross = bool(getattr(module, "is_cross_attention", False))
    e = module.c_attn.weight.shape[0]
    site = Site(path=path, unit_path=path, family="GPT-2", layout="packed", out="c_proj", out_transposed=True,
                projections=("q_attn", "c_attn") if cross else ("c_attn",),
                heads=_heads(module, getattr(module, "config", None)), dropout=_dropout(module))
    if module.c_attn.bias is not None:
        # c_attn computes [q | k | v] (or [k | v] in cross-attention) = x W + b, W of shape (E, 3E)
        k0 = 0 if cross else e
        site.key = Slot("c_attn", "bias", k0, k0 + e)
        site.value = Slot("c_attn", "bias", k0 + e, k0 + 2 * e)
    if module.c_proj.bias is None:
        site.refuse_fold = "c_proj has no bias to fold b_v into"
    return site


def discover(model: nn.Module) -> tuple[list[Site], list[dict[str, str]]]:
    """Attention sites this package handles or refuses by family, and unknown attention-like
    modules (listed with a reason, never changed)."""
    sites: list[Site] = []
    candidates = []
    for path, module in model.named_modules():
        family = verified_family(module)
        if isinstance(module, nn.MultiheadAttention):
            sites.append(_mha_site(path, module))
        elif family == "GPT-2" and _is_projection(getattr(module, "c_attn", None)):
            sites.append(_gpt2_site(path, module))
        elif family is not None and _triple(module):
            site = _hf_site(model, path, module, family, _triple(module))
            if site is None:
                candidates.append((path, module, "verified class, but no output projection with the expected name"))
            else:
                sites.append(site)
        elif any(n in DEBERTA for n in _mro_names(module)):
            site = Site(path=path, unit_path=path, family="DeBERTa-v2", layout="triple")
            site.refuse_strip = site.refuse_fold = _deberta_reason(module)
            sites.append(site)
        elif _triple(module) or _ATTENTION_NAME.search(type(module).__name__) or (
            _is_projection(getattr(module, "c_attn", None)) or _is_projection(getattr(module, "qkv", None))
        ) or _calls_sdpa(module):
            candidates.append((path, module, None))

    taken = [s.path for s in sites] + [s.unit_path for s in sites]

    def related(path: str) -> bool:
        return any(t == path or (t and (t.startswith(path + ".") or path.startswith(t + "."))) or
                   (not path and t) for t in taken)

    unknown = []
    for path, module, reason in candidates:
        if related(path):
            continue
        rope = _rotary_reason(module) or _qk_norm_reason(module)
        if rope and _triple(module) and getattr(module, _triple(module)[1]).bias is not None:
            # A known breaking structure with a key bias: refuse rather than pass over it.
            site = Site(path=path, unit_path=path, family=type(module).__name__, layout="triple")
            site.refuse_strip = site.refuse_fold = rope
            sites.append(site)
            continue
        if rope and _triple(module):
            unknown.append({"module": path or "<root>", "type": type(module).__name__,
                            "reason": f"{rope}; this module has no key bias, so there is nothing to remove"})
            continue
        unknown.append({"module": path or "<root>", "type": type(module).__name__,
                        "reason": reason or _unknown_reason(module)})
    return sites, unknown
