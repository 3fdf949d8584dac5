"""The probes' projection memo: W x reused across probes only where input and weight are the same."""

import torch
import transformers
from torch import nn

from keybias.surgery._core import _ProjectionMemo


def _unit():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 9), nn.Tanh(), nn.Linear(9, 4)).double()


def test_memo_follows_bias_input_and_weight_changes():
    unit, x = _unit(), torch.randn(3, 5, 6, dtype=torch.float64)
    reference = _unit()
    memo = _ProjectionMemo(unit)
    assert len(memo.patched) == 2
    for step in range(4):
        with torch.no_grad():
            if step == 1:  # a bias edit, as the probes make: must show in the output
                unit[0].bias += 1.0
                reference[0].bias += 1.0
            if step == 2:  # a weight written in place: the remembered product is stale
                unit[0].weight.mul_(2.0)
                reference[0].weight.mul_(2.0)
            if step == 3:
                x = x + 1.0  # a different input
            y, ref = unit(x), reference(x)
        assert torch.allclose(y, ref, rtol=0, atol=1e-12), step
    memo.close()
    assert "forward" not in unit[0].__dict__ and not memo.patched


def test_memo_reuses_the_product_on_the_same_input():
    unit, x = _unit(), torch.randn(2, 6, dtype=torch.float64)
    memo = _ProjectionMemo(unit)
    products = []
    real_matmul = torch.Tensor.__matmul__

    def counting(a, b):
        products.append(b.shape)
        return real_matmul(a, b)

    torch.Tensor.__matmul__ = counting
    try:
        unit(x)
        unit(x.clone())  # equal values, another tensor: still the same W x
    finally:
        torch.Tensor.__matmul__ = real_matmul
        memo.close()
    # the first projection's product once; the second sees tanh of the same values, also once
    assert len(products) == 2


def test_memo_handles_gpt2_conv1d():
    conv = transformers.pytorch_utils.Conv1D(7, 5).double()
    with torch.no_grad():
        conv.weight.normal_()
        conv.bias.normal_()
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    expected = conv(x)
    memo = _ProjectionMemo(conv)
    assert memo.patched == [conv]
    assert torch.allclose(conv(x), expected, rtol=0, atol=1e-12)
    with torch.no_grad():
        conv.bias.add_(3.0)
    assert torch.allclose(conv(x), expected + 3.0, rtol=0, atol=1e-12)
    memo.close()
