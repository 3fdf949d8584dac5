"""Surgery on trained models: remove the key bias b_k, fold the value bias b_v.

Two identities make this exact.

Key bias (softmax shift invariance). With keys k_j = W_k x_j + b_k, every score of
query i is s_ij = q_i . k_j / sqrt(d) = q_i . (W_k x_j) / sqrt(d) + q_i . b_k / sqrt(d).
The second term does not depend on j, and softmax(s + c 1) = softmax(s) for any c, so
the attention weights, and everything after them, do not depend on b_k. Additive masks
(causal, padding, -inf) add a per-(i, j) term and keep this true. Dropout on the
weights acts after the softmax, so it keeps it true too.

Value bias (rows sum to one). With values v_j = W_v x_j + b_v and weights p_ij that
sum to one over j, sum_j p_ij v_j = sum_j p_ij W_v x_j + b_v, and after the output
projection W_o (bias b_o) the constant becomes W_o b_v + b_o. So b_v can be set to zero
and b_o replaced by b_o' = b_o + W_o b_v.

Where the identities need a partner parameter or fail, per nn.MultiheadAttention option:
    * add_bias_kv: an extra key slot holding `bias_k` (not projected, so it does not get
      b_k) and an extra value slot holding `bias_v`. Removing b_k shifts the real scores
      by -q.b_k but not the extra one, unless the extra key moves too: with
      bias_k' = bias_k - b_k every score of row i shifts by the same -q_i.b_k / sqrt(d).
      Likewise bias_v' = bias_v - b_v for the value fold. b_k is redundant *jointly*
      with bias_k, and the tools fold it there.
    * add_zero_attn: an extra key and value slot that are always exactly zero and get no
      bias. Removing b_k changes the real scores but not the zero slot's, and folding
      b_v changes the real values but not the zero value: both change the function,
      and both tools refuse.
    * kdim/vdim (separate q/k/v weights) and batch_first change nothing: the bias is
      still the middle third of `in_proj_bias`.
    * bias=False: there is no b_k or b_v; the module is reported as unchanged.
    * dropout > 0 on the attention weights: in training mode a dropped-out row no longer
      sums to one, so the value fold is exact only in eval mode. `fold_value_bias`
      refuses such modules unless called with allow_dropout=True. The key strip is
      exact in both modes.

How "removed" is represented.
    * A key projection that is its own nn.Linear (Hugging Face `key` in BERT/RoBERTa,
      `k_proj` in ViT; see HF_BERT_STYLE and HF_PROJ_STYLE): its
      bias is replaced by None, exactly as nn.Linear(bias=False) stores it. This saves
      the parameters, their gradients and their optimizer state (two buffers per entry
      with Adam). The state_dict loses the `key.bias` entry; it loads into a model that
      went through the same surgery with the standard load_state_dict, and into an
      unmodified model with strict=False (whatever b_k that model then holds, the
      function is the same).
    * The packed `in_proj_bias` of nn.MultiheadAttention cannot lose a slice. The tool
      re-parameterizes it with torch.nn.utils.parametrize: the stored, trainable
      parameter holds only the kept entries (b_q and b_v, or b_q alone after both
      tools), and `in_proj_bias` is computed as that vector with zeros in the removed
      slots. PyTorch code that reads `mha.in_proj_bias` (the module's own forward, the
      fast path of nn.TransformerEncoderLayer) sees a normal tensor. The removed
      entries have no storage, gradient or optimizer state. The state_dict key becomes
      `...parametrizations.in_proj_bias.original`: save and load with state_dict on a
      model that went through the same surgery (run the tool on a freshly built model
      first, then load). `torch.nn.utils.parametrize.remove_parametrizations(mha,
      "in_proj_bias")` turns it back into a plain MultiheadAttention whose b_k is zero.
      Pickling the whole module (torch.save(model)) is not supported by parametrize;
      use the state_dict.

Loading weights is the caller's job; use safetensors or torch.load(weights_only=True).
This module never unpickles anything.

Modules the tools do not know but that look like attention (class name containing
"attention" or "attn") are listed in the report under `not_handled` with a reason;
they are never silently skipped and never changed.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

# Hugging Face classes whose forward is: q, k, v = Linear(x); softmax(q k^T * scale +
# additive mask) v, with the output projection in the parent's `output.dense`.
HF_BERT_STYLE = (
    "BertSelfAttention",
    "BertCrossAttention",
    "RobertaSelfAttention",
    "RobertaCrossAttention",
)
# The same forward with q_proj/k_proj/v_proj and the output projection o_proj inside the
# module (no rotary embeddings). Other classes with these names (LLaMA, Qwen2, ...) rotate
# q and k by position and are NOT handled.
HF_PROJ_STYLE = ("ViTAttention",)
_RELATIVE_POSITIONS = ("relative_key", "relative_key_query")
_ATTENTION_NAME = re.compile(r"attention|attn", re.IGNORECASE)


class _KeepEntries(nn.Module):
    """Parametrization: a full bias vector computed from its kept entries (zeros elsewhere)."""

    def __init__(self, keep: torch.Tensor):
        super().__init__()
        self.register_buffer("keep", keep.clone(), persistent=False)

    def forward(self, kept: torch.Tensor) -> torch.Tensor:
        full = kept.new_zeros(self.keep.shape)
        return full.masked_scatter(self.keep, kept)

    def right_inverse(self, full: torch.Tensor) -> torch.Tensor:
        return full[self.keep]


def _new_report(operation: str) -> dict[str, Any]:
    return {
        "operation": operation,
        "modules_changed": [],
        "parameters_removed": [],
        "parameters_folded": [],
        "parameters_saved": 0,
        "unchanged": [],
        "not_handled": [],
        "message": "",
    }


def _mha_keep_mask(mha: nn.MultiheadAttention) -> torch.Tensor:
    """Which entries of the packed in_proj_bias are still stored (all, if never cut)."""
    if parametrize.is_parametrized(mha, "in_proj_bias"):
        return mha.parametrizations.in_proj_bias[0].keep.clone()
    return torch.ones(3 * mha.embed_dim, dtype=torch.bool, device=mha.in_proj_bias.device)


@torch.no_grad()
def _mha_remove_slot(mha: nn.MultiheadAttention, slot: int) -> int:
    """Zero slot (0=q, 1=k, 2=v) of in_proj_bias and drop its storage; return entries saved."""
    e = mha.embed_dim
    keep = _mha_keep_mask(mha)
    full = mha.in_proj_bias.detach().clone()
    if parametrize.is_parametrized(mha, "in_proj_bias"):
        parametrize.remove_parametrizations(mha, "in_proj_bias", leave_parametrized=True)
    saved = int(keep[slot * e : (slot + 1) * e].sum())
    keep[slot * e : (slot + 1) * e] = False
    full[slot * e : (slot + 1) * e] = 0
    mha.in_proj_bias.copy_(full)
    parametrize.register_parametrization(mha, "in_proj_bias", _KeepEntries(keep))
    return saved


def _slot_removed(mha: nn.MultiheadAttention, slot: int) -> bool:
    e = mha.embed_dim
    return not bool(_mha_keep_mask(mha)[slot * e : (slot + 1) * e].any())


def _parent(model: nn.Module, path: str) -> nn.Module | None:
    if not path:
        return None
    parent_path = path.rpartition(".")[0]
    return model.get_submodule(parent_path)


def _hf_output_dense(model: nn.Module, path: str) -> nn.Linear | None:
    parent = _parent(model, path)
    output = getattr(parent, "output", None) if parent is not None else None
    dense = getattr(output, "dense", None)
    return dense if isinstance(dense, nn.Linear) else None


def _names(kind: str) -> tuple[str, str, str]:
    return ("q_proj", "k_proj", "v_proj") if kind == "hfproj" else ("query", "key", "value")


def _hf_out(model: nn.Module, path: str, kind: str, module: nn.Module) -> nn.Linear | None:
    if kind == "hfproj":
        out = getattr(module, "o_proj", None)
        return out if isinstance(out, nn.Linear) else None
    return _hf_output_dense(model, path)


def _hf_dropout(module: nn.Module) -> float:
    drop = getattr(module, "dropout", None)
    if isinstance(drop, nn.Dropout):
        return drop.p
    return float(getattr(module, "attention_dropout", 0.0) or 0.0)


def _hf_refusal(module: nn.Module, kind: str = "hf") -> str | None:
    config = getattr(module, "config", None)
    pos = getattr(config, "position_embedding_type", "absolute") or "absolute"
    pos = getattr(module, "position_embedding_type", pos)
    if pos in _RELATIVE_POSITIONS:
        return (
            f"position_embedding_type={pos!r} adds q.r_(i-j) terms that mix with the key, so "
            "the attention is not a plain softmax of q.k and b_k's shift invariance is not verified"
        )
    if not all(isinstance(getattr(module, n, None), nn.Linear) for n in _names(kind)):
        return f"expected nn.Linear layers {_names(kind)}"
    return None


def _unknown_reason(module: nn.Module) -> str:
    names = {n for n, _ in module.named_children()}
    if {"q_norm", "k_norm"} & names or {"q_layernorm", "k_layernorm"} & names:
        return "unknown attention type with QK-norm: keys are normalized after b_k, so b_k is not a uniform score shift"
    if any("rotary" in n for n in names) or hasattr(module, "rotary_emb"):
        return "unknown attention type with rotary embeddings: the rotation makes q.R b_k depend on the key position"
    if {"q_proj", "k_proj"} <= names:
        return (
            "unknown q_proj/k_proj attention: models of this shape (LLaMA, Qwen2, ...) rotate keys by "
            "position after b_k, which makes q.R_j b_k depend on j; left as is"
        )
    return "unknown attention type: its key bias was left as is, because its redundancy is not verified"


def _scan(model: nn.Module) -> tuple[list[tuple[str, str, nn.Module]], list[dict[str, str]]]:
    """Known attention modules as (path, kind, module), and unknown attention-like ones."""
    known = []
    for path, module in model.named_modules():
        if isinstance(module, nn.MultiheadAttention):
            known.append((path, "mha", module))
        elif type(module).__name__ in HF_BERT_STYLE:
            known.append((path, "hf", module))
        elif type(module).__name__ in HF_PROJ_STYLE:
            known.append((path, "hfproj", module))
    known_paths = [p for p, _, _ in known]

    def related(path: str) -> bool:
        """path is a known module, or an ancestor or a descendant of one."""
        for k in known_paths:
            if k == path or path == "" or k == "" or k.startswith(path + ".") or path.startswith(k + "."):
                return True
        return False

    unknown = []
    for path, module in model.named_modules():
        if not _ATTENTION_NAME.search(type(module).__name__) or related(path):
            continue
        unknown.append({"module": path or "<root>", "type": type(module).__name__, "reason": _unknown_reason(module)})
    return known, unknown


def _finish(report: dict[str, Any], known: list) -> dict[str, Any]:
    if not known and not report["not_handled"]:
        report["message"] = "no attention modules found; nothing to do"
        warnings.warn(f"{report['operation']}: {report['message']}", stacklevel=3)
    elif not known:
        report["message"] = "no attention modules that this tool handles; see not_handled"
        warnings.warn(f"{report['operation']}: {report['message']}", stacklevel=3)
    return report


def strip_key_bias(model: nn.Module) -> dict[str, Any]:
    """Remove the key bias b_k from every attention module of `model`, in place and exactly.

    Identity: softmax_j(q_i . (W_k x_j + b_k) / sqrt(d) + m_ij) = softmax_j(q_i . W_k x_j /
    sqrt(d) + m_ij), because q_i . b_k / sqrt(d) is the same for every key j of row i and
    softmax is invariant to adding a constant to a row. It holds for any additive mask
    m_ij, any dropout on the weights, batch_first either way, kdim/vdim, self- and
    cross-attention, and in train and eval mode.

    Exact when every key of a row gets the same b_k. Per module type:
        nn.MultiheadAttention: b_k (middle third of in_proj_bias) is removed; with
            add_bias_kv it is folded into the extra key slot, bias_k' = bias_k - b_k
            (jointly redundant); with add_zero_attn the zero key gets no bias, so removing
            b_k changes the function: ValueError. bias=False: nothing to remove.
        Hugging Face attention with separate q/k/v nn.Linear layers (classes in
            HF_BERT_STYLE: `query`/`key`/`value`, output projection in the parent's
            `output.dense`; HF_PROJ_STYLE: `q_proj`/`k_proj`/`v_proj`/`o_proj`): the key
            Linear's bias becomes None. Other classes named like attention (LLaMA, Qwen2:
            rotary embeddings; QK-norm) are listed as not handled. Relative position
            embeddings (relative_key, relative_key_query): ValueError. Only additive
            attention masks may be passed (as BERT does); a key/value cache filled before
            the surgery holds keys with b_k and must be discarded.
    Equal in exact arithmetic; in floating point the outputs differ by rounding only (the
    scores change by q.b_k, so the rounding of the scores changes).

    Every module is checked before any is changed: if one must be refused, a ValueError
    naming each such module path and its reason is raised and the model is left untouched.
    Attention-like modules of unknown type are listed in report["not_handled"]. Do this
    before building an optimizer (it changes the parameter set).

    Returns a report dict: modules_changed, parameters_removed, parameters_folded,
    parameters_saved (stored entries removed), unchanged, not_handled, message.
    """
    report = _new_report("strip_key_bias")
    known, report["not_handled"] = _scan(model)
    plan, refusals = [], []
    for path, kind, module in known:
        name = path or "<root>"
        if kind == "mha":
            if module.in_proj_bias is None:
                report["unchanged"].append({"module": name, "reason": "bias=False: no key bias"})
            elif _slot_removed(module, 1):
                report["unchanged"].append({"module": name, "reason": "key bias already removed"})
            elif module.add_zero_attn:
                refusals.append(
                    f"{name}: add_zero_attn=True appends a zero key that gets no b_k, so removing "
                    "b_k changes the scores of the real keys but not of the zero key"
                )
            else:
                plan.append((path, kind, module))
        else:
            reason = _hf_refusal(module, kind)
            if reason:
                refusals.append(f"{name}: {reason}")
            elif getattr(module, _names(kind)[1]).bias is None:
                report["unchanged"].append({"module": name, "reason": "key has no bias"})
            else:
                plan.append((path, kind, module))
    if refusals:
        raise ValueError("strip_key_bias refused, model unchanged:\n  " + "\n  ".join(refusals))

    with torch.no_grad():
        for path, kind, module in plan:
            prefix = f"{path}." if path else ""
            if kind == "mha":
                e = module.embed_dim
                b_k = module.in_proj_bias.detach()[e : 2 * e].clone()
                if module.bias_k is not None:
                    module.bias_k.sub_(b_k.view_as(module.bias_k).to(module.bias_k.dtype))
                    report["parameters_folded"].append(
                        f"{prefix}in_proj_bias[{e}:{2 * e}] -> {prefix}bias_k (bias_k - b_k)"
                    )
                saved = _mha_remove_slot(module, 1)
                report["parameters_removed"].append(f"{prefix}in_proj_bias[{e}:{2 * e}]")
            else:
                key_name = _names(kind)[1]
                key = getattr(module, key_name)
                saved = key.bias.numel()
                key.bias = None
                report["parameters_removed"].append(f"{prefix}{key_name}.bias")
            report["parameters_saved"] += saved
            report["modules_changed"].append(path or "<root>")
    return _finish(report, known)


def fold_value_bias(model: nn.Module, *, allow_dropout: bool = False) -> dict[str, Any]:
    """Fold the value bias b_v into the output-projection bias, in place: b_o' = b_o + W_o b_v.

    Identity: if the attention weights p_ij of each row sum to one, sum_j p_ij (W_v x_j +
    b_v) = sum_j p_ij W_v x_j + b_v, so W_o(. + b_v) + b_o = W_o(.) + (b_o + W_o b_v).

    Exact when every value slot carries the same b_v and the rows sum to one:
        nn.MultiheadAttention: b_v (last third of in_proj_bias) is removed, out_proj.bias
            gets W_o b_v; with add_bias_kv the extra value slot moves too, bias_v' =
            bias_v - b_v; add_zero_attn (a zero value without b_v): ValueError.
        Hugging Face attention (HF_BERT_STYLE, HF_PROJ_STYLE): the value Linear's bias
            becomes None and the output projection's bias (`output.dense` of the parent, or
            `o_proj`) gets W_o b_v. A head mask that scales rows would break it.
        dropout on the attention weights: rows sum to one only in eval mode; refused
            unless allow_dropout=True, in which case the fold is exact in eval mode only.
    The fold is done in float64 and rounded once to the parameter dtype. Unlike b_k,
    b_v has a nonzero gradient: the fold keeps the function, not the training dynamics.

    Validation precedes any change (ValueError naming module paths, model untouched).
    Returns the same report dict as `strip_key_bias`.
    """
    report = _new_report("fold_value_bias")
    known, report["not_handled"] = _scan(model)
    plan, refusals = [], []
    for path, kind, module in known:
        name = path or "<root>"
        if kind == "mha":
            p = module.dropout
            if module.in_proj_bias is None:
                report["unchanged"].append({"module": name, "reason": "bias=False: no value bias"})
            elif _slot_removed(module, 2):
                report["unchanged"].append({"module": name, "reason": "value bias already folded"})
            elif module.add_zero_attn:
                refusals.append(
                    f"{name}: add_zero_attn=True appends a zero value that gets no b_v, so the "
                    "weighted sum of values does not shift by b_v"
                )
            elif module.out_proj.bias is None:
                refusals.append(f"{name}: out_proj has no bias to fold b_v into")
            elif p > 0 and not allow_dropout:
                refusals.append(
                    f"{name}: dropout={p} on the attention weights: rows do not sum to one in "
                    "training mode (pass allow_dropout=True for a fold exact in eval mode)"
                )
            else:
                plan.append((path, kind, module, module.out_proj))
        else:
            reason = _hf_refusal(module, kind)
            dense = None if reason else _hf_out(model, path, kind, module)
            p = _hf_dropout(module)
            if reason:
                refusals.append(f"{name}: {reason}")
            elif getattr(module, _names(kind)[2]).bias is None:
                report["unchanged"].append({"module": name, "reason": "value has no bias"})
            elif dense is None or dense.bias is None:
                refusals.append(f"{name}: no output projection Linear with a bias to fold b_v into")
            elif p > 0 and not allow_dropout:
                refusals.append(
                    f"{name}: attention dropout={p}: rows do not sum to one in training mode "
                    "(pass allow_dropout=True for a fold exact in eval mode)"
                )
            else:
                plan.append((path, kind, module, dense))
    if refusals:
        raise ValueError("fold_value_bias refused, model unchanged:\n  " + "\n  ".join(refusals))

    with torch.no_grad():
        for path, kind, module, out in plan:
            prefix = f"{path}." if path else ""
            parent_path = path.rpartition(".")[0]
            out_name = {"mha": "out_proj", "hfproj": "o_proj"}.get(
                kind, f"{parent_path + '.' if parent_path else ''}output.dense"
            )
            if kind == "mha":
                e = module.embed_dim
                b_v = module.in_proj_bias.detach()[2 * e :].clone()
            else:
                value = getattr(module, _names(kind)[2])
                b_v = value.bias.detach().clone()
            shift = out.weight.detach().double() @ b_v.double()
            out.bias.copy_((out.bias.double() + shift).to(out.bias.dtype))
            if kind == "mha":
                if module.bias_v is not None:
                    module.bias_v.sub_(b_v.view_as(module.bias_v).to(module.bias_v.dtype))
                    report["parameters_folded"].append(f"{prefix}in_proj_bias[{2 * e}:] -> {prefix}bias_v")
                saved = _mha_remove_slot(module, 2)
                report["parameters_removed"].append(f"{prefix}in_proj_bias[{2 * e}:{3 * e}]")
                report["parameters_folded"].append(f"{prefix}in_proj_bias[{2 * e}:] -> {prefix}out_proj.bias")
            else:
                saved = value.bias.numel()
                value.bias = None
                vname = _names(kind)[2]
                out_full = f"{prefix}{out_name}" if kind == "hfproj" else out_name
                report["parameters_removed"].append(f"{prefix}{vname}.bias")
                report["parameters_folded"].append(f"{prefix}{vname}.bias -> {out_full}.bias")
            report["parameters_saved"] += saved
            report["modules_changed"].append(path or "<root>")
    return _finish(report, known)
