"""The verdict rule on cases built to be redundant and cases built not to be."""

import math

import pytest
import torch

from keybias import verdict as VD


def test_unit_roundoff_known_and_unknown():
    assert VD.unit_roundoff("float32") == 2.0**-24
    assert VD.unit_roundoff(torch.bfloat16) == 2.0**-8
    with pytest.raises(ValueError, match="allowed"):
        VD.unit_roundoff("float8")


def test_lambda_from_failure_probability():
    assert math.isclose(2 * math.exp(-VD.LAMBDA**2 / 2), VD.FAILURE_PROBABILITY)


def test_output_tolerance_defaults_are_backward_compatible():
    base = VD.output_tolerance("float32", head_dim=4, n_keys=9, score_abs_max=2.0, value_abs_max=3.0)
    u = 2.0**-24
    assert math.isclose(base, 2 * VD.LAMBDA * u * 3.0 * (2 * 2 * 2.0 + 3))
    more = VD.output_tolerance("float32", head_dim=4, n_keys=9, score_abs_max=2.0, value_abs_max=3.0,
                               out_dim=16, output_abs_max=5.0)
    assert math.isclose(more, base + 2 * VD.LAMBDA * u * 3.0 * 4 + 2 * u * 5.0)


def test_tolerance_scales_with_roundoff():
    kw = {"head_dim": 8, "n_keys": 16, "score_abs_max": 1.0, "value_abs_max": 1.0}
    assert VD.output_tolerance("bfloat16", **kw) / VD.output_tolerance("float32", **kw) == 2.0**16


def test_measured_tolerance_takes_the_smaller_bound():
    assert VD.measured_tolerance(1.0, error_base=0.1, error_perturbed=0.2, reference_tolerance=0.0) == pytest.approx(0.3)
    assert VD.measured_tolerance(0.1, error_base=0.1, error_perturbed=0.2) == 0.1
    assert VD.measured_tolerance(0.1, error_base=math.nan, error_perturbed=0.2) == 0.1


def test_classify_cases():
    assert VD.classify(1e-9, 1e-7, control_delta=1.0) == VD.REDUNDANT
    assert VD.classify(1e-3, 1e-7, control_delta=1.0) == VD.NOT_REDUNDANT
    assert VD.classify(1e-9, 1e-7, control_delta=1e-8) == VD.INVALID
    assert VD.classify(math.nan, 1e-7, control_delta=1.0) == VD.INVALID


def _attention(q, k, v):
    return torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1) @ v


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_rule_on_bare_attention(dtype):
    """A shared shift of every key is within the tolerance; a shift of one key is not."""
    g = torch.Generator().manual_seed(0)
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(6, 8, generator=g, dtype=torch.float64) for _ in range(3))
    delta = torch.randn(8, generator=g, dtype=torch.float64)
    base = _attention(q.to(dt), k.to(dt), v.to(dt)).double()
    shared = _attention(q.to(dt), (k + delta).to(dt), v.to(dt)).double()
    one = k.clone()
    one[0] += delta
    single = _attention(q.to(dt), one.to(dt), v.to(dt)).double()
    ctrl = _attention((q + delta).to(dt), k.to(dt), v.to(dt)).double()
    s = float((q.norm(dim=-1).max() * (k + delta).norm(dim=-1).max()) / math.sqrt(8))
    tol = VD.output_tolerance(dtype, head_dim=8, n_keys=6, score_abs_max=s, value_abs_max=float(v.abs().max()))
    control = float((ctrl - base).abs().max())
    assert VD.classify(float((shared - base).abs().max()), tol, control_delta=control) == VD.REDUNDANT
    assert VD.classify(float((single - base).abs().max()), tol, control_delta=control) == VD.NOT_REDUNDANT
