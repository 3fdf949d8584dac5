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
OWN_OUTPUTS = ("o_proj", "out_proj", "out_lin", "c_proj", "o", "dense", "proj", "wo")
# Fused q/k/v projections (one Linear or Conv1D computing all three).
FUSED = ("c_attn", "query_key_value", "qkv", "Wqkv", "qkv_proj", "in_proj", "qkv_linear")
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
# Attention-like class names: ...Attention..., ...Attn..., and the short names some libraries use
# (timm's ConViT MHSA and GPSA, MultiHead...).
_ATTENTION_NAME = re.compile(r"attention|attn|mhsa|gpsa|multihead", re.IGNORECASE)
# Keyword arguments that carry rotary position embeddings into an attention call (Hugging Face's
# position_embeddings (cos, sin), timm's rope, Meta's freqs_cis, ...).
ROPE_ARGUMENTS = ("position_embeddings", "rope", "freqs_cis", "rotary_pos_emb", "rotary_emb", "rope_cache", "sincos")


@dataclass
class Slot:
    """A bias vector: attribute `name` of the submodule `owner` (relative to the unit), whole
    or the entries start:stop of a packed vector."""

    owner: str
    name: str
    start: int | None = None
    stop: int | None = None
    index: tuple[int, ...] | None = None  # scattered entries of a fused bias (per-head layouts)
    label: str = ""

    @property
    def packed(self) -> bool:
        return self.start is not None or self.index is not None

    def select(self):
        """What indexes the slot's entries in the full bias vector."""
        if self.index is not None:
            return list(self.index)
        return slice(self.start, self.stop)

    def describe(self, unit_path: str) -> str:
        base = ".".join(p for p in (unit_path, self.owner, self.name) if p)
        if self.index is not None:
            return f"{base}[{self.label or f'{len(self.index)} entries'}]"
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
    query: Slot | None = None  # the control of the redundancy probe
    out: str | None = None  # output projection, relative to the unit
    out_transposed: bool = False  # Conv1D stores W_o as (in, out)
    out_bias: str = "bias"  # the output bias's name on `out` (TransformerLens: b_O on the unit)
    zeros_only: bool = False  # the forward reads the bias slots directly: a removed slot stays, as zeros
    key_partner: Slot | None = None  # add_bias_kv's extra key slot
    value_partner: Slot | None = None
    projections: tuple[str, ...] = ()  # q, k, v modules relative to the unit (hooked to measure)
    heads: int = 1
    dropout: float = 0.0
    refuse_strip: str | None = None
    refuse_fold: str | None = None
    notes: list[str] = field(default_factory=list)
    trusted: bool = False  # a verified class whose forward is not overridden: random inputs suffice
    module_type: str = ""

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


ROPE_REASON = ("rotary position embeddings (RoPE) rotate each key by its position after b_k is added, "
               "so the score term q_i . R_j b_k depends on the key position j and is not a row constant")


def _is_rope_class(module: nn.Module) -> bool:
    return any(re.search(r"rope|rotary", c.__name__, re.IGNORECASE) for c in type(module).__mro__)


def _rotary_reason(module: nn.Module) -> str | None:
    names = {n for n, _ in module.named_children()}
    if any("rotary" in n for n in names) or hasattr(module, "rotary_emb") or _is_rope_class(module):
        return ROPE_REASON
    return None


def _qk_norm_reason(module: nn.Module) -> str | None:
    # a norm slot filled with nn.Identity (timm's default qk_norm=False) normalizes nothing
    names = {n for n, child in module.named_children() if not isinstance(child, nn.Identity)}
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


def _unknown_reason(module: nn.Module) -> str:
    if isinstance(getattr(module, "gating_param", None), nn.Parameter) and _is_projection(getattr(module, "qk", None)):
        return ("ConViT's gated positional self-attention (GPSA): q and k come from one projection qk and a "
                "learned gate mixes the content softmax with a positional softmax, a layout this tool does not "
                "rewrite, so its key bias was left as is")
    for reason in (_rotary_reason(module), _qk_norm_reason(module), _position_reason(module)):
        if reason:
            return f"unknown attention class; {reason}"
    return ("unknown attention class: its function has not been verified, so its key bias was left "
            "as is")


def _dropout(module: nn.Module) -> float:
    # Hugging Face: dropout / attention_dropout; timm: attn_drop (an nn.Dropout on the weights)
    for attr in ("dropout", "attn_dropout", "attention_dropout", "attn_drop"):
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


def _trusted(module: nn.Module) -> bool:
    """A verified class, or a subclass that keeps its forward: random inputs of the verified
    shape exercise it fully. A subclass that overrides forward may do anything (apply rotary
    embeddings when passed position_embeddings), so it is certified only on its real calls."""
    for cls in type(module).__mro__:
        if cls.__name__ in VERIFIED:
            return type(module).forward is cls.forward
    return False


def _output_projection(model: nn.Module, path: str, module: nn.Module) -> tuple[str, str, str] | None:
    """(unit_path, prefix of the module inside the unit, output projection inside the unit):
    the module's own output projection, or its parent's `output.dense` (BERT, ViT, Swin)."""
    own = next((n for n in OWN_OUTPUTS if _is_projection(getattr(module, n, None))
                and n not in FUSED), None)
    if own is not None:
        return path, "", own
    if not path:
        return None
    parent_path = path.rpartition(".")[0]
    parent = model.get_submodule(parent_path)
    dense = getattr(getattr(parent, "output", None), "dense", None)
    if _is_projection(dense):
        return parent_path, path.rpartition(".")[2] + ".", "output.dense"
    return None


def _site_base(model: nn.Module, path: str, module: nn.Module, family: str, layout: str) -> Site:
    config = getattr(module, "config", None)
    found = _output_projection(model, path, module)
    unit_path, prefix, out = found if found else (path, "", None)
    site = Site(path=path, unit_path=unit_path, family=family, layout=layout, out=out,
                heads=_heads(module, config), dropout=_dropout(module), trusted=_trusted(module),
                module_type=type(module).__name__)
    site.notes.append(prefix)  # popped by the callers: the module's path inside the unit
    if out is None:
        site.refuse_fold = "no output projection found (o_proj, out_proj, dense, output.dense, ...) to fold b_v into"
    else:
        unit = model.get_submodule(unit_path) if unit_path else model
        out_module = unit.get_submodule(out)
        if getattr(out_module, "bias", None) is None:
            site.refuse_fold = "the output projection has no bias to fold b_v into"
        site.out_transposed = type(out_module).__name__.endswith("Conv1D")
    return site


def _hf_site(model: nn.Module, path: str, module: nn.Module, family: str, names) -> Site:
    site = _site_base(model, path, module, family, "triple")
    prefix = site.notes.pop()
    q, k, v = (getattr(module, n) for n in names)
    site.projections = tuple(prefix + n for n in names)
    if k.bias is not None:
        site.key = Slot(prefix + names[1], "bias")
    else:
        site.notes.append(f"{names[1]} has no bias")
    if v.bias is not None:
        site.value = Slot(prefix + names[2], "bias")
    if q.bias is not None:
        site.query = Slot(prefix + names[0], "bias")
    reason = _position_reason(module)
    if reason:  # a key-dependent score term; values are untouched, so the fold stays exact
        site.refuse_strip = reason
    return site


def _head_sizes(module: nn.Module, width: int, heads: int) -> tuple[int, int]:
    """(head size, number of key/value heads) from the module or its config."""
    config = getattr(module, "config", None)
    d = getattr(module, "head_dim", None) or getattr(module, "head_size", None)
    if not isinstance(d, int) or d <= 0:
        d = width // max(heads, 1)
    kv = None
    for obj in (module, config):
        for attr in ("num_kv_heads", "num_key_value_heads", "num_kv", "n_head_kv"):
            value = getattr(obj, attr, None)
            if isinstance(value, int) and value > 0:
                kv = value
                break
        if kv:
            break
    if getattr(config, "multi_query", False) and not getattr(config, "new_decoder_architecture", False):
        kv = 1
    return d, kv or heads


def _fused_site(model: nn.Module, path: str, module: nn.Module, name: str) -> Site:
    """q, k, v computed by one projection. The layout of its output (and bias) is read from
    the structure: [q | k | v] thirds (GPT-2's Conv1D c_attn, ViT-style qkv), [q | k | v]
    with fewer key/value heads (multi-query, grouped-query qkv_proj), BLOOM/GPT-NeoX's per-head
    interleaved (heads, 3, d), or Falcon's grouped (kv heads, group + 2, d). A wrong reading is
    caught by the redundancy probe and its control, and refused."""
    family = verified_family(module) or type(module).__name__
    site = _site_base(model, path, module, family, "packed")
    prefix = site.notes.pop()
    proj = getattr(module, name)
    conv1d = type(proj).__name__.endswith("Conv1D")
    width_in, total = (proj.weight.shape if conv1d else proj.weight.shape[::-1])
    site.projections = (prefix + name,)
    if _is_rope_class(module):  # keys are rotated after b_k; values are not, so the fold stays exact
        site.refuse_strip = ROPE_REASON
    cross = bool(getattr(module, "is_cross_attention", False)) and _is_projection(getattr(module, "q_attn", None))
    query = "q_attn"
    if name == "kv":  # timm's MAP pooling head: q from a learned latent through q, [k | v] from kv
        cross, query = True, "q"
        reason = _qk_norm_reason(module)
        if reason:
            site.refuse_strip = reason
    if cross:  # GPT-2 cross-attention: q from q_attn, [k | v] from c_attn
        site.projections = (prefix + query, prefix + name)
    if getattr(proj, "bias", None) is None:
        owner = prefix[:-1] if prefix else ""
        holder = module
        if isinstance(getattr(holder, "v_bias", None), nn.Parameter):
            # BEiT / EVA (timm): qkv has no bias; the forward adds cat(q_bias, k_bias, v_bias), where
            # k_bias is a zero buffer. There is no key bias to strip; v_bias can be folded.
            site.value = Slot(owner, "v_bias")
            site.zeros_only = True
            if isinstance(getattr(holder, "q_bias", None), nn.Parameter):
                site.query = Slot(owner, "q_bias")
            site.notes.append(f"{name} has no bias; the key bias k_bias is a zero buffer")
        else:
            site.notes.append(f"{name} has no bias")
        return site
    heads = site.heads
    d, kv = _head_sizes(module, width_in, heads)
    owner = prefix + name
    config = getattr(module, "config", None)
    if cross:
        e = total // 2
        site.key, site.value = Slot(owner, "bias", 0, e), Slot(owner, "bias", e, 2 * e)
        if getattr(getattr(module, query), "bias", None) is not None:
            site.query = Slot(prefix + query, "bias")
        return site
    if name == "query_key_value" and getattr(config, "new_decoder_architecture", False) and kv and heads % kv == 0:
        g = heads // kv  # Falcon: (kv heads, g queries + key + value, d)
        blocks = [(h, j) for h in range(kv) for j in range(g + 2)]
        pick = {r: [b for b, (_, j) in enumerate(blocks) if (j < g if r == "q" else j == (g if r == "k" else g + 1))]
                for r in "qkv"}
        slots = {r: tuple(e for b in pick[r] for e in range(b * d, (b + 1) * d)) for r in "qkv"}
        site.query, site.key, site.value = (Slot(owner, "bias", index=slots[r], label=f"{r} entries of each group")
                                            for r in "qkv")
    elif name == "query_key_value" and kv == heads and total == 3 * heads * d:
        # BLOOM, GPT-NeoX, Falcon without multi-query: (heads, 3, d)
        slots = {r: tuple(h * 3 * d + i * d + e for h in range(heads) for e in range(d)) for i, r in enumerate("qkv")}
        site.query, site.key, site.value = (Slot(owner, "bias", index=slots[r], label=f"{r} entries of each head")
                                            for r in "qkv")
    elif total == heads * d + 2 * kv * d:
        q_end, k_end = heads * d, heads * d + kv * d
        site.query = Slot(owner, "bias", 0, q_end)
        site.key = Slot(owner, "bias", q_end, k_end)
        site.value = Slot(owner, "bias", k_end, total)
    elif total % 3 == 0:
        e = total // 3
        site.query, site.key, site.value = (Slot(owner, "bias", i * e, (i + 1) * e) for i in range(3))
    else:
        site.notes.append(f"{name}: layout of its {total} outputs not recognised")
        site.refuse_strip = site.refuse_fold = (f"the fused projection {name} has {total} outputs in a layout this "
                                                "tool does not recognise")
    return site


def _gpt2_site(model: nn.Module, path: str, module: nn.Module) -> Site:
    return _fused_site(model, path, module, "c_attn")


def _fused_name(module: nn.Module) -> str | None:
    name = next((n for n in FUSED if _is_projection(getattr(module, n, None))), None)
    if name is None and _is_latent_pool(module):
        return "kv"
    return name


def _is_latent_pool(module: nn.Module) -> bool:
    """timm's attention pooling head (AttentionPoolLatent, the MAP head of SigLIP ViTs): queries
    from a learned latent through `q`, keys and values from one projection `kv` as [k | v]."""
    return (isinstance(getattr(module, "latent", None), nn.Parameter) and _is_projection(getattr(module, "q", None))
            and _is_projection(getattr(module, "kv", None)))


def _is_lens_attention(module: nn.Module) -> bool:
    """TransformerLens's own multi-head attention (HookedTransformer's blocks[i].attn): per-head
    W_Q/W_K/W_V [heads, d_model, d_head], b_Q/b_K/b_V [heads, d_head], W_O, b_O. Grouped-query
    and other subclasses store their key bias differently and are left to the generic search."""
    cls = type(module)
    return (cls.__name__ == "Attention" and cls.__module__.startswith("transformer_lens")
            and all(isinstance(getattr(module, n, None), nn.Parameter) for n in ("b_K", "b_V", "W_O", "b_O")))


def _lens_site(path: str, module: nn.Module) -> Site:
    """A HookedTransformer attention. Its score is q_i . k_j * scale (+ an additive mask, ALiBi,
    or a shortformer position term on the inputs), so b_K shifts each row by a constant; rotary
    embeddings, a soft cap on the scores (tanh) or QK-norm act between b_K and the score and
    make it matter: those are refused."""
    cfg = getattr(module, "cfg", None)
    site = Site(path=path, unit_path=path, family="TransformerLens Attention", layout="lens", out="",
                out_bias="b_O", zeros_only=True, heads=int(getattr(cfg, "n_heads", 1) or 1), module_type="Attention",
                key=Slot("", "b_K"), value=Slot("", "b_V"), query=Slot("", "b_Q"))
    if getattr(cfg, "positional_embedding_type", "standard") == "rotary":
        site.refuse_strip = ROPE_REASON
    elif float(getattr(cfg, "attn_scores_soft_cap", -1.0) or -1.0) > 0:
        site.refuse_strip = ("attn_scores_soft_cap applies tanh to the scores, so the row constant q_i . b_K "
                             "does not pass through unchanged")
    elif getattr(cfg, "use_qk_norm", False):
        site.refuse_strip = ("QK-norm normalizes each key after b_K is added, so b_K does not shift the scores "
                             "by a row constant")
    return site


def discover(model: nn.Module) -> tuple[list[Site], list[dict[str, str]]]:
    """Attention sites found by structure (q/k/v projections, separate or fused, and an output
    projection), and other attention-like modules (listed with a reason, never changed).

    Each module is visited once, however many names or containers it is registered under."""
    sites: list[Site] = []
    candidates = []
    for path, module in model.named_modules():
        if any(path.startswith(s.path + ".") for s in sites if s.path):
            continue  # inside a site already found (the q/k/v projections themselves)
        family = verified_family(module)
        if isinstance(module, nn.MultiheadAttention):
            sites.append(_mha_site(path, module))
        elif _is_lens_attention(module):
            sites.append(_lens_site(path, module))
        elif _triple(module):
            sites.append(_hf_site(model, path, module, family or type(module).__name__, _triple(module)))
        elif _fused_name(module) and (_ATTENTION_NAME.search(type(module).__name__) or family):
            sites.append(_fused_site(model, path, module, _fused_name(module)))
        elif _ATTENTION_NAME.search(type(module).__name__) or _calls_sdpa(module):
            candidates.append((path, module, None))

    taken = [s.path for s in sites] + [s.unit_path for s in sites]

    def related(path: str) -> bool:
        return any(t == path or (t and (t.startswith(path + ".") or path.startswith(t + "."))) or
                   (not path and t) for t in taken)

    unknown = []
    for path, module, reason in candidates:
        if related(path):
            continue
        unknown.append({"module": path or "<root>", "type": type(module).__name__,
                        "reason": reason or _unknown_reason(module)})
    return sites, unknown


def explain_dependence(site: Site, module: nn.Module, calls) -> str:
    """Why b_k is not redundant in a module whose output the probe showed to depend on it,
    read from the structure of the module and of its real calls."""
    names = {n for n, _ in module.named_modules()}
    rotary = hasattr(module, "rotary_emb") or any("rotary" in n for n in names) or _is_rope_class(module)
    for args, kwargs in calls:
        if any(kwargs.get(k) is not None for k in ROPE_ARGUMENTS):
            rotary = True
        for value in list(kwargs.values()) + list(args[1:]):
            if (isinstance(value, tuple) and len(value) == 2 and all(hasattr(t, "shape") for t in value)
                    and value[0].shape == value[1].shape):
                rotary = True  # a (cos, sin) pair
    if rotary:
        return ROPE_REASON
    if _qk_norm_reason(module):
        return _qk_norm_reason(module)
    config = getattr(module, "config", None)
    kinds = getattr(module, "pos_att_type", None) or getattr(config, "pos_att_type", None) or ()
    if "p2c" in kinds:
        return ("disentangled attention: its position-to-content term k_j . r_q(j - i) contains b_k . r_q(j - i), "
                "which depends on the key position j")
    return ("the output depends on b_k beyond rounding: something acts on the key between b_k and the score "
            "(a key-dependent position term, a normalization, a gate)")
