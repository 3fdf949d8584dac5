# Owner(s): ["module: nn"]
"""is_causal=True with key slots appended by multi_head_attention_forward.

bias_k/bias_v (add_bias_kv) and add_zero_attn append key/value slots after the source keys;
static_k/static_v replace the projected keys and values, possibly with a different length.
Every query may attend to an appended slot: an explicit attn_mask is padded with a visible
(zero) column for each. The causal mask that is_causal stands for must therefore be the
(tgt_len, src_len) causal mask over the source keys, src_len being static_k's length when
static_k is given, plus one visible column per appended slot; and the output must not depend
on need_weights.

Written in the style of test/nn/test_multihead_attention.py, to be moved there.
"""

import math

import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)

# option -> (add_bias_kv, add_zero_attn, static_kv)
OPTIONS = {
    "none": (False, False, False),
    "add_bias_kv": (True, False, False),
    "add_zero_attn": (False, True, False),
    "both": (True, True, False),
    "static_k": (False, False, True),
    "static_k_add_zero_attn": (False, True, True),
}

EMBED_DIM, NUM_HEADS, BSZ, TGT_LEN, STATIC_LEN = 8, 2, 2, 4, 6


def _causal_mask(tgt_len, src_len, dtype):
    # The mask SDPA's is_causal stands for, aligned to the top left; for
    # tgt_len == src_len it is nn.Transformer.generate_square_subsequent_mask.
    return torch.triu(torch.full((tgt_len, src_len), float("-inf"), dtype=dtype), diagonal=1)


class TestMultiheadAttentionCausalKeySlots(TestCase):
    def _inputs(self, option, dtype=torch.double):
        add_bias_kv, add_zero_attn, static_kv = OPTIONS[option]
        torch.manual_seed(0)
        E, H, N, L = EMBED_DIM, NUM_HEADS, BSZ, TGT_LEN
        x = torch.randn(L, N, E, dtype=dtype)  # self-attention: query = key = value
        args = dict(
            in_proj_weight=torch.randn(3 * E, E, dtype=dtype) / math.sqrt(E),
            in_proj_bias=torch.randn(3 * E, dtype=dtype),
            bias_k=torch.randn(1, 1, E, dtype=dtype) if add_bias_kv else None,
            bias_v=torch.randn(1, 1, E, dtype=dtype) if add_bias_kv else None,
            add_zero_attn=add_zero_attn,
            out_proj_weight=torch.randn(E, E, dtype=dtype) / math.sqrt(E),
            out_proj_bias=torch.randn(E, dtype=dtype),
            static_k=None,
            static_v=None,
        )
        if static_kv:
            # A length different from key's, as in a key/value cache.
            args["static_k"] = torch.randn(N * H, STATIC_LEN, E // H, dtype=dtype)
            args["static_v"] = torch.randn(N * H, STATIC_LEN, E // H, dtype=dtype)
        src_len = STATIC_LEN if static_kv else L
        return x, args, src_len

    def _key_padding_mask(self, src_len, dtype):
        # Hides source key 1 from the second batch entry; no query is left
        # without a visible key.
        kpm = torch.zeros(BSZ, src_len, dtype=dtype)
        kpm[1, 1] = float("-inf")
        return kpm

    def _forward(self, x, args, attn_mask, need_weights, key_padding_mask=None):
        return F.multi_head_attention_forward(
            x, x, x, EMBED_DIM, NUM_HEADS,
            args["in_proj_weight"], args["in_proj_bias"], args["bias_k"], args["bias_v"],
            args["add_zero_attn"], 0.0, args["out_proj_weight"], args["out_proj_bias"],
            training=False, key_padding_mask=key_padding_mask, need_weights=need_weights,
            attn_mask=attn_mask, is_causal=True,
            static_k=args["static_k"], static_v=args["static_v"],
        )[0]

    def _reference(self, x, args, src_len, key_padding_mask=None):
        # Attention written out: causal over the src_len source keys, every
        # appended slot visible to every query.
        E, H, N, L = EMBED_DIM, NUM_HEADS, BSZ, TGT_LEN
        hd = E // H
        q, k, v = F.linear(x, args["in_proj_weight"], args["in_proj_bias"]).chunk(3, dim=-1)
        if args["bias_k"] is not None:
            k = torch.cat([k, args["bias_k"].expand(1, N, E)])
            v = torch.cat([v, args["bias_v"].expand(1, N, E)])
        q = q.reshape(L, N * H, hd).transpose(0, 1)
        if args["static_k"] is not None:
            k, v = args["static_k"], args["static_v"]
        else:
            k = k.reshape(-1, N * H, hd).transpose(0, 1)
            v = v.reshape(-1, N * H, hd).transpose(0, 1)
        if args["add_zero_attn"]:
            k = torch.cat([k, k.new_zeros(N * H, 1, hd)], dim=1)
            v = torch.cat([v, v.new_zeros(N * H, 1, hd)], dim=1)
        n_slots = k.size(1) - src_len
        mask = F.pad(_causal_mask(L, src_len, x.dtype), (0, n_slots))
        if key_padding_mask is not None:
            # batch entry n is rows n * H ... n * H + H - 1, as in the function
            kpm = F.pad(key_padding_mask, (0, n_slots)).repeat_interleave(H, dim=0)
            mask = mask + kpm[:, None, :]
        weights = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hd) + mask, dim=-1)
        out = (weights @ v).transpose(0, 1).reshape(L, N, E)
        return F.linear(out, args["out_proj_weight"], args["out_proj_bias"])

    @parametrize("key_padding_mask", [False, True])
    @parametrize("need_weights", [False, True])
    @parametrize("option", list(OPTIONS))
    def test_is_causal_matches_explicit_reference(self, option, need_weights, key_padding_mask):
        x, args, src_len = self._inputs(option)
        attn_mask = _causal_mask(TGT_LEN, src_len, x.dtype)
        kpm = self._key_padding_mask(src_len, x.dtype) if key_padding_mask else None
        out = self._forward(x, args, attn_mask, need_weights, key_padding_mask=kpm)
        self.assertEqual(out, self._reference(x, args, src_len, key_padding_mask=kpm))

    @parametrize("option", list(OPTIONS))
    def test_is_causal_output_independent_of_need_weights(self, option):
        x, args, src_len = self._inputs(option)
        attn_mask = _causal_mask(TGT_LEN, src_len, x.dtype)
        self.assertEqual(
            self._forward(x, args, attn_mask, need_weights=False),
            self._forward(x, args, attn_mask, need_weights=True),
        )


instantiate_parametrized_tests(TestMultiheadAttentionCausalKeySlots)

if __name__ == "__main__":
    run_tests()
