"""Property tests over random nn.MultiheadAttention configurations: strip and fold either keep
the output within the verdict tolerance or refuse and leave the module bit-identical."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from keybias import surgery, verdict

pytestmark = pytest.mark.filterwarnings("ignore::keybias.surgery.InPlaceWriteWarning",
                                        "ignore::keybias.surgery.FullyMaskedRowWarning")


@st.composite
def configurations(draw):
    heads = draw(st.integers(1, 3))
    embed = heads * draw(st.integers(1, 4))
    separate = draw(st.booleans())
    return {
        "embed_dim": embed, "num_heads": heads,
        "kdim": draw(st.integers(1, 6)) if separate else None,
        "vdim": draw(st.integers(1, 6)) if separate else None,
        "batch_first": draw(st.booleans()), "bias": draw(st.booleans()),
        "add_bias_kv": draw(st.booleans()), "add_zero_attn": draw(st.booleans()),
        "dtype": draw(st.sampled_from(["float32", "float64"])),
        "queries": draw(st.integers(1, 4)), "keys": draw(st.integers(1, 5)), "batch": draw(st.integers(1, 3)),
        "mask": draw(st.sampled_from(["none", "padding", "causal"])),
        "seed": draw(st.integers(0, 2**16)),
    }


def _build(cfg):
    gen = torch.Generator().manual_seed(cfg["seed"])
    keys = {k: cfg[k] for k in ("embed_dim", "num_heads", "kdim", "vdim", "batch_first", "bias",
                                "add_bias_kv", "add_zero_attn")}
    m = nn.MultiheadAttention(**keys).to(getattr(torch, cfg["dtype"])).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype))
    dtype = getattr(torch, cfg["dtype"])
    b, lq, lk = cfg["batch"], cfg["queries"], cfg["keys"]
    q = torch.randn(b, lq, cfg["embed_dim"], generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(b, lk, m.kdim, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(b, lk, m.vdim, generator=gen, dtype=torch.float64).to(dtype)
    if not cfg["batch_first"]:
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    kwargs = {"need_weights": False}
    if cfg["mask"] == "padding" and lk > 1:
        pad = torch.zeros(b, lk, dtype=torch.bool)
        pad[-1, -1] = True  # never every key of a row
        kwargs["key_padding_mask"] = pad
    elif cfg["mask"] == "causal" and lq == lk:
        kwargs["attn_mask"] = nn.Transformer.generate_square_subsequent_mask(lq, dtype=dtype)
    return m, (q, k, v), kwargs


def _tolerance(m, inputs, y, dtype):
    """The verdict rule's analytic output bound for this module and these inputs."""
    q, k, v = inputs
    if not m.batch_first:
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    e, h = m.embed_dim, m.num_heads
    w = m.in_proj_weight if m._qkv_same_embed_dim else None
    wq, wk, wv = w.split(e) if w is not None else (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)
    bias = m.in_proj_bias if m.in_proj_bias is not None else torch.zeros(3 * e, dtype=q.dtype)
    qq = (q.double() @ wq.double().T + bias[:e].double()).abs()
    kk = (k.double() @ wk.double().T + bias[e:2 * e].double()).abs()
    vv = (v.double() @ wv.double().T + bias[2 * e:].double()).abs()
    if m.bias_k is not None:  # the extra key/value slot of add_bias_kv (before and after the fold)
        extra_k = (m.bias_k.detach().double().abs() + bias[e:2 * e].double().abs()).expand(kk.shape[0], 1, e)
        extra_v = (m.bias_v.detach().double().abs() + bias[2 * e:].double().abs()).expand(vv.shape[0], 1, e)
        kk, vv = torch.cat([kk, extra_k], 1), torch.cat([vv, extra_v], 1)
    d = e // h
    qh = qq.reshape(*qq.shape[:2], h, d).transpose(1, 2)
    kh = kk.reshape(*kk.shape[:2], h, d).transpose(1, 2)
    score = float((qh @ kh.transpose(-1, -2)).amax()) / d**0.5
    v_max = vv.amax(dim=(0, 1))
    value = float((m.out_proj.weight.detach().double().abs() @ v_max).amax())
    return verdict.output_tolerance(dtype, head_dim=d, n_keys=kk.shape[1] + 1, score_abs_max=score,
                                    value_abs_max=value, out_dim=e, output_abs_max=float(y.abs().amax()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configurations(), st.sampled_from(["strip", "fold"]))
def test_exact_within_tolerance_or_refused_untouched(cfg, tool):
    m, inputs, kwargs = _build(cfg)
    with torch.no_grad():
        y0 = m(*inputs, **kwargs)[0]
        tol = _tolerance(m, inputs, y0, cfg["dtype"])
    before = {k: v.clone() for k, v in m.state_dict().items()}
    fn = surgery.strip_key_bias if tool == "strip" else surgery.fold_value_bias
    try:
        fn(m)
    except surgery.SurgeryRefused:
        assert cfg["add_zero_attn"] and cfg["bias"]  # the only refusal among these options
        after = m.state_dict()
        assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
        return
    with torch.no_grad():
        y1 = m(*inputs, **kwargs)[0]
    assert torch.isfinite(y1).all()
    assert float((y1.double() - y0.double()).abs().max()) <= tol


def test_the_property_has_power_against_a_wrong_fold():
    """The same tolerance flags a fold that forgets W_o b_v (b_v zeroed, b_o kept)."""
    cfg = {"embed_dim": 8, "num_heads": 2, "kdim": None, "vdim": None, "batch_first": True, "bias": True,
           "add_bias_kv": False, "add_zero_attn": False, "dtype": "float32", "queries": 3, "keys": 4,
           "batch": 2, "mask": "padding", "seed": 0}
    m, inputs, kwargs = _build(cfg)
    with torch.no_grad():
        y0 = m(*inputs, **kwargs)[0]
        tol = _tolerance(m, inputs, y0, "float32")
        m.in_proj_bias[16:] = 0
        y1 = m(*inputs, **kwargs)[0]
    assert float((y1.double() - y0.double()).abs().max()) > tol
