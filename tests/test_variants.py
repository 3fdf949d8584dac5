"""Reference variants: dropping b_k is exact exactly where keybias.studies.fixtures.variants.DROP_IS_EXACT says."""

import pytest
import torch

from keybias.studies.fixtures import variants as V


def _inputs(e=16, n=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, n, e, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("variant", V.VARIANTS)
def test_drop_matches_prediction(variant):
    x = _inputs()
    p = V.init_params(16, 2, variant=variant, seed=1)
    full = V.attention(x, x, p, num_heads=2, variant=variant)
    dropped = V.attention(x, x, p, num_heads=2, variant=variant, drop_key_bias=True)
    rel = float((full - dropped).abs().max() / full.abs().max())
    if V.DROP_IS_EXACT[variant][0]:
        assert rel < 1e-12
    else:
        assert rel > 1e-4


def test_drop_flag_equals_zero_bias():
    x = _inputs()
    p = V.init_params(16, 4, variant="rope", seed=2)
    q = dict(p, b_k=torch.zeros_like(p["b_k"]))
    a = V.attention(x, x, p, num_heads=4, variant="rope", drop_key_bias=True)
    b = V.attention(x, x, q, num_heads=4, variant="rope")
    assert torch.equal(a, b)


def test_sink_key_jointly_exact():
    """Shifting b_k and the sink key by the same vector is exact; b_k alone is not."""
    x = _inputs()
    p = V.init_params(16, 2, variant="sink_key", seed=3)
    delta = torch.randn(16, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    base = V.attention(x, x, p, num_heads=2, variant="sink_key")
    alone = V.attention(x, x, dict(p, b_k=p["b_k"] + delta), num_heads=2, variant="sink_key")
    joint = V.attention(x, x, dict(p, b_k=p["b_k"] + delta, sink_key=p["sink_key"] + delta.view(2, 8)),
                        num_heads=2, variant="sink_key")
    assert float((joint - base).abs().max()) < 1e-12
    assert float((alone - base).abs().max()) > 1e-4


def test_softmax_matches_torch_sdpa():
    x = _inputs()
    p = V.init_params(16, 2, seed=5)
    q, k, v = V.projections(x, x, p, num_heads=2)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 7, 16)
    ref = ref @ p["w_o"].T + p["b_o"]
    assert torch.allclose(V.attention(x, x, p, num_heads=2), ref, atol=1e-12)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="allowed"):
        V.init_params(16, 2, variant="linear")
    with pytest.raises(ValueError, match="multiple"):
        V.init_params(10, 3)
