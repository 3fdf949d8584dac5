#!/usr/bin/env python3
"""Minimal reproducer: nn.MultiheadAttention's output depends on need_weights when
is_causal=True and the module appends key/value slots (add_bias_kv or add_zero_attn).

Only torch is needed. Run:  python is_causal_need_weights_quirk.py  [--json]

What it does: one float64 module, one input, one causal mask, passed together with
is_causal=True as the documentation asks ("is_causal provides a hint that attn_mask is the
causal mask"). The call is made twice, with need_weights=False and need_weights=True, and the
two outputs are compared. Mathematically they are the same attention; the flag should only
decide whether the weights are returned.

Why they differ (torch/nn/functional.py, multi_head_attention_forward): with
need_weights=False and no key_padding_mask, the function drops attn_mask and hands
is_causal=True to scaled_dot_product_attention. The extra slot (bias_k, or the zero key)
is appended after the L source keys, so the key axis has L+1 entries, and SDPA's
top-left-aligned causal mask over an (L, L+1) score matrix hides that last column from every
query. With need_weights=True the given attn_mask is padded with a visible column for the
extra slot, as documented, so every query attends to it.
"""

from __future__ import annotations

import argparse
import json

import torch


def outputs_for(option: str, *, embed_dim: int = 4, num_heads: int = 2, length: int = 3, seed: int = 0):
    """Outputs of one module for need_weights False and True, and the explicit reference."""
    if option not in ("add_bias_kv", "add_zero_attn", "plain"):
        raise ValueError(f"option {option!r} not one of ['add_bias_kv', 'add_zero_attn', 'plain']")
    torch.manual_seed(seed)
    mha = torch.nn.MultiheadAttention(
        embed_dim, num_heads, batch_first=True, dtype=torch.float64,
        add_bias_kv=option == "add_bias_kv", add_zero_attn=option == "add_zero_attn",
    ).eval()
    if mha.bias_k is not None:
        torch.nn.init.normal_(mha.bias_k)
        torch.nn.init.normal_(mha.bias_v)
    x = torch.randn(1, length, embed_dim, dtype=torch.float64)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(length, dtype=torch.float64)
    with torch.no_grad():
        without_weights = mha(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)[0]
        with_weights = mha(x, x, x, attn_mask=causal, is_causal=True, need_weights=True)[0]
        # The documented semantics, with is_causal left out: the mask is padded by MHA itself.
        reference = mha(x, x, x, attn_mask=causal, need_weights=False)[0]
    return without_weights, with_weights, reference


def report(seed: int = 0) -> list[dict]:
    rows = []
    for option in ("plain", "add_bias_kv", "add_zero_attn"):
        without_weights, with_weights, reference = outputs_for(option, seed=seed)
        rows.append({
            "option": option,
            "torch": torch.__version__,
            "max_abs_diff_need_weights": float((without_weights - with_weights).abs().max()),
            "max_abs_diff_false_vs_reference": float((without_weights - reference).abs().max()),
            "max_abs_diff_true_vs_reference": float((with_weights - reference).abs().max()),
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = report(args.seed)
    if args.json:
        print(json.dumps(rows))
        return
    print(f"torch {torch.__version__}; float64; attn_mask = causal mask and is_causal=True")
    for r in rows:
        print(f"{r['option']:>14}: |out(need_weights=False) - out(need_weights=True)| = "
              f"{r['max_abs_diff_need_weights']:.3e}   (False vs documented: "
              f"{r['max_abs_diff_false_vs_reference']:.3e}, True vs documented: "
              f"{r['max_abs_diff_true_vs_reference']:.3e})")


if __name__ == "__main__":
    main()
