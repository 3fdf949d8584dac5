"""Surgery on trained models: remove the key bias b_k, fold the value bias b_v, certified.

Two identities make this exact.

Key bias (softmax shift invariance). With keys k_j = W_k x_j + b_k, every score of query i
is s_ij = q_i . W_k x_j / sqrt(d) + q_i . b_k / sqrt(d). The second term does not depend on j,
and softmax(s + c 1) = softmax(s), so the weights, and all that follows, ignore b_k. Additive
masks (causal, padding) and dropout on the weights keep this true.

Value bias (rows sum to one). With values v_j = W_v x_j + b_v and weights p_ij summing to one
over j, sum_j p_ij v_j = sum_j p_ij W_v x_j + b_v; after the output projection the constant is
W_o b_v + b_o, so b_v can become zero and b_o becomes b_o + W_o b_v.

What the tools handle (each decision is tested, and each change is certified):
    * nn.MultiheadAttention, packed or with kdim/vdim, alone or inside nn.Transformer layers;
      with add_bias_kv, b_k is folded into the extra key slot (bias_k - b_k) and b_v into
      bias_v; add_zero_attn is refused (its zero key and value get no bias).
    * torch.ao.nn.quantizable.MultiheadAttention (it projects through linear_K/linear_V).
    * Hugging Face BERT, RoBERTa, ELECTRA, DistilBERT, ViT, CLIP (text and vision), BART-style
      encoder-decoders, Whisper (its k_proj has no bias: the strip leaves it, the fold acts),
      GPT-2 (the key third of the packed Conv1D `c_attn` bias), and subclasses of these classes.
      A BERT-style class with position_embedding_type='relative_key' adds only q_i . r_(i-j),
      which does not involve the key, so b_k stays redundant and is removed.
    * timm: ViT-style Attention (packed qkv; attn_drop is read, so the fold is refused under
      attention dropout like Hugging Face's), BEiT/EVA (no key bias to strip: k_bias is a zero
      buffer; the separate v_bias is folded and kept as zeros), ConViT's MHSA (packed qkv) and
      GPSA (listed); AttentionRope and other rope classes refuse the strip with the RoPE reason.
      Inputs come from the model's pretrained_cfg['input_size'] (or the size it was built for).
    * TransformerLens HookedTransformer (3.x): b_K [heads, d_head] becomes exact zeros (the
      Parameter stays, since its forward reads it), b_V is folded into b_O (the same result as
      TransformerLens's fold_value_biases, in float64); rotary models, attn_scores_soft_cap and
      QK-norm refuse the strip. TransformerLens 4.x's TransformerBridge wraps a Hugging Face
      model: run the tools on that model (bridge.original_model, or before booting the bridge);
      the bridge's own components are not changed by the tools.
    * Refused, naming the assumption that fails: rotary embeddings with a key bias (LLaMA with
      attention_bias, Qwen2), DeBERTa-v2 (position-to-content term), relative_key_query,
      add_zero_attn, dropout on the weights for the value fold (unless allow_dropout=True:
      exact in eval mode), tied parameters shared with other modules, the meta device.
    * Other attention-like modules (found by structure: q/k/v projections, packed projections,
      a scaled_dot_product_attention call, or the class name) are listed in
      report["not_handled"] with a reason, and never changed.

All-or-nothing. Every module is planned, then every planned change is certified on a float64
copy of that module alone (never of the whole model): on the calls the model really makes,
captured by one forward of the model in its own dtype on example inputs, and on random calls
of the same structure; or, for verified classes without such calls, on random inputs with a
padding mask (the output change judged with keybias.verdict.output_tolerance). Only then are the
changes applied, and the whole model is run once more in its own dtype: its output must stay
within that dtype's rounding bound (whole_model_bound), or everything is rolled back. Any
refusal raises SurgeryRefused with the model unchanged; any error while applying restores the
model bit-exactly (the same Parameter objects, the same values). Memory: the model plus one
float64 unit and the activations of the example inputs.

Storage. storage='remove' (default) frees the removed entries: an nn.Linear/Conv1D bias becomes
None; a packed bias (in_proj_bias, c_attn.bias) is re-parameterized with
torch.nn.utils.parametrize so that only the kept entries are stored and trained. Then
    * torch.jit.script fails at once with a message (use storage='zeros');
    * in-place writes to the packed bias (zero_, copy_, _reset_parameters) do not reach the
      stored entries (an InPlaceWriteWarning says so);
    * the state_dict keys change (load into a model that went through the same surgery).
storage='zeros' writes explicit zeros into plain parameters instead: no memory is saved, and
everything that works on the original model (TorchScript, save_pretrained/from_pretrained,
in-place writes) works unchanged. The command line uses it.

Fully masked rows. On PyTorch's SDPA path a query row whose keys are all masked gets zero
weights, so its output is b_o alone; after the fold it is b_o + W_o b_v. fold_value_bias warns
(FullyMaskedRowWarning) unless the caller passes assume_no_fully_masked_rows=True. The key strip
is unaffected (zero weights ignore b_k).

Checkpoints larger than memory. The tools work on a module in memory; nothing in them needs
the rest of the model except the whole-model check. `python -m keybias.surgery` uses that on a
sharded safetensors checkpoint: it builds the model on the meta device, loads one attention
module at a time from its shards, runs these tools on that module alone with built inputs
(certified in float64 on its own copy, then checked in the checkpoint's dtype against its
rounding bound), and copies the shards with the changed biases, one shard at a time. Each
module is exact on its own whatever feeds it, so the composed model is too; the whole model
is never run, nor held in memory (see keybias.surgery.cli).

Loading weights is the caller's job; this package never unpickles anything.
"""

from __future__ import annotations

import warnings
from typing import Any

# The library does not need NumPy; without it torch warns on import that it could not load it,
# which would reach every user of the core install.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
from torch import nn  # noqa: E402

from keybias.surgery._core import (  # noqa: E402  (after the filter above)
    STORAGES,
    FullyMaskedRowWarning,
    InPlaceWriteWarning,
    SurgeryRefused,
    plan,
    run_surgery,
)

__all__ = ["strip_key_bias", "fold_value_bias", "plan", "SurgeryRefused", "InPlaceWriteWarning",
           "FullyMaskedRowWarning", "STORAGES"]


def strip_key_bias(model: nn.Module, *, storage: str = "remove", inputs: Any = None) -> dict[str, Any]:
    """Remove the key bias b_k from every handled attention module of `model`, in place.

    Identity: softmax_j(q_i . (W_k x_j + b_k) / sqrt(d) + m_ij) = softmax_j(q_i . W_k x_j /
    sqrt(d) + m_ij), because q_i . b_k / sqrt(d) is the same for every key j of row i. It holds
    for any additive mask m_ij, dropout on the weights, train and eval mode, self- and
    cross-attention. With add_bias_kv the extra key moves too (bias_k' = bias_k - b_k). It
    fails when something acts on the key between b_k and the score (rotary embeddings,
    QK-norm, a position term k_j . r), or when some key slot lacks b_k (add_zero_attn): such
    modules are refused. A key/value cache filled before the surgery holds keys with b_k and
    must be discarded.

    Equal in exact arithmetic; in floating point the outputs differ by rounding (the scores
    change by q . b_k). Each change is certified on a float64 copy of its module before it is
    kept; see the package docstring for all-or-nothing, storage and the traps.

    Returns a report: per module (report["modules"]) the action, the parameters removed, the
    certified change and its tolerance (and their ratio), and the reason for anything left;
    also parameters_removed, parameters_folded, parameters_saved (stored entries freed),
    unchanged, not_handled and notes. Raises SurgeryRefused (a ValueError) naming each refused
    module and its reason; the model is then unchanged.
    """
    return run_surgery(model, "strip_key_bias", storage=storage, inputs=inputs)


def fold_value_bias(model: nn.Module, *, storage: str = "remove", allow_dropout: bool = False,
                    assume_no_fully_masked_rows: bool = False, inputs: Any = None) -> dict[str, Any]:
    """Fold the value bias into the output-projection bias, in place: b_o' = b_o + W_o b_v.

    Identity: if the weights p_ij of each row sum to one, sum_j p_ij (W_v x_j + b_v) =
    sum_j p_ij W_v x_j + b_v, so W_o(. + b_v) + b_o = W_o(.) + (b_o + W_o b_v). It needs every
    value slot to carry b_v (add_bias_kv: bias_v' = bias_v - b_v; add_zero_attn: refused) and
    rows that sum to one: dropout on the weights breaks it in training mode (refused unless
    allow_dropout=True: exact in eval mode), a head mask that scales rows breaks it, and a
    fully masked row on the SDPA path (zero weights) changes from b_o to b_o + W_o b_v: a
    FullyMaskedRowWarning says so unless assume_no_fully_masked_rows=True. The fold is computed
    in float64 and rounded once. Unlike b_k, b_v has a gradient: the fold keeps the function,
    not the training dynamics.

    Certified, all-or-nothing and reported as `strip_key_bias`.
    """
    report = run_surgery(model, "fold_value_bias", storage=storage, allow_dropout=allow_dropout, inputs=inputs)
    if report["modules_changed"] and not assume_no_fully_masked_rows:
        note = ("fold_value_bias: a fully masked query row (all keys masked) gets zero weights on PyTorch's "
                "SDPA path, so its output changes from b_o to b_o + W_o b_v; pass "
                "assume_no_fully_masked_rows=True if the model never sees one")
        report["notes"].append(note)
        warnings.warn(note, FullyMaskedRowWarning, stacklevel=2)
    return report
