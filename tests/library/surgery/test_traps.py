"""The traps of issue 11: TorchScript, meta device, in-place writes, fully masked rows,
structural discovery, and the public interface."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

from keybias import surgery
from keybias.studies.fixtures import families


def _mha(**kw):
    m = nn.MultiheadAttention(8, 2, batch_first=True, **kw)
    return families.randomize_biases(m, 0).double().eval()


def _x(seed=0):
    return torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_torchscript_fails_at_once_naming_the_alternative():
    m = _mha()
    with pytest.warns(surgery.InPlaceWriteWarning):
        surgery.strip_key_bias(m)
    with pytest.raises(RuntimeError, match="storage='zeros'"):
        torch.jit.script(m)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_torchscript_works_with_explicit_zeros():
    m = _mha()
    x = _x()
    y0 = m(x, x, x)[0]
    report = surgery.strip_key_bias(m, storage="zeros")
    assert report["parameters_saved"] == 0 and report["modules_changed"] == ["<root>"]
    scripted = torch.jit.script(m)
    assert (scripted(x, x, x)[0] - y0).abs().max() <= 1e-12


def test_torch_export_handles_the_reparameterized_bias():
    m = _mha()
    x = _x()
    y0 = m(x, x, x, need_weights=False)[0]
    with pytest.warns(surgery.InPlaceWriteWarning):
        surgery.strip_key_bias(m)
        surgery.fold_value_bias(m, assume_no_fully_masked_rows=True)

    class Self(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x, x, x, need_weights=False)[0]

    exported = torch.export.export(Self(m), (x,))
    assert (exported.module()(x) - y0).abs().max() <= 1e-12


def test_meta_device_is_refused_clearly_and_plan_counts():
    with torch.device("meta"):
        model = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    with pytest.raises(surgery.SurgeryRefused, match="meta device"):
        surgery.strip_key_bias(model)
    counted = surgery.plan(model)
    assert counted["key_bias_entries"] == 8 and counted["value_bias_entries"] == 8


def test_in_place_writes_after_strip_are_warned_about_and_zeros_storage_keeps_them():
    m = _mha()
    with pytest.warns(surgery.InPlaceWriteWarning, match="in-place writes"):
        report = surgery.strip_key_bias(m)
    assert any("in-place" in n for n in report["notes"])
    m.in_proj_bias.zero_()  # the documented trap: a computed tensor, the write is lost
    assert torch.count_nonzero(m.in_proj_bias[:8]) > 0
    z = _mha()
    surgery.strip_key_bias(z, storage="zeros")
    z.in_proj_bias.data.zero_()
    assert torch.count_nonzero(z.in_proj_bias) == 0  # a plain Parameter: the write lands


def test_fold_warns_about_fully_masked_rows_unless_told():
    with pytest.warns(surgery.FullyMaskedRowWarning, match="fully masked"):
        surgery.fold_value_bias(_mha(), storage="zeros")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        surgery.fold_value_bias(_mha(), storage="zeros", assume_no_fully_masked_rows=True)


def test_fully_masked_row_changes_as_documented_on_sdpa():
    """Why the warning exists: SDPA gives a fully masked row zero weights, so its output is
    b_o before the fold and b_o + W_o b_v after it; every other row is unchanged."""
    m = _mha()
    x = _x()
    mask = torch.zeros(2, 5, 5, dtype=torch.bool)
    mask[0, 2, :] = True  # query 2 of example 0 sees no key
    attn_mask = mask.repeat_interleave(2, dim=0)
    with torch.no_grad():
        b_o = m.out_proj.bias.clone()
        shift = m.out_proj.weight @ m.in_proj_bias[16:]

    def run(model):
        q = k = v = x
        bias = torch.zeros(4, 5, 5, dtype=torch.float64).masked_fill(attn_mask, float("-inf"))
        return model(q, k, v, attn_mask=bias, need_weights=False)[0]

    y0 = run(m)
    surgery.fold_value_bias(m, storage="zeros", assume_no_fully_masked_rows=True)
    y1 = run(m)
    other = torch.ones(2, 5, dtype=torch.bool)
    other[0, 2] = False
    assert torch.allclose(y0[0, 2], b_o, atol=1e-12)  # SDPA path: zero weights, output b_o
    assert torch.allclose(y1[0, 2], b_o + shift, atol=1e-12)
    assert (y1[other] - y0[other]).abs().max() <= 1e-12


class Mixer(nn.Module):
    """Attention without 'attention' or 'attn' in its class name."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return nn.functional.scaled_dot_product_attention(q, k, v)


class Blender(nn.Module):
    """No projections by a known name, but a scaled_dot_product_attention call."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.lin(x).chunk(3, -1)
        return nn.functional.scaled_dot_product_attention(q, k, v)


def test_attention_is_found_by_structure_not_name():
    model = nn.Sequential(Mixer(), Blender())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = surgery.strip_key_bias(model)
    listed = {u["module"]: u for u in report["not_handled"]}
    assert set(listed) == {"0", "1"}
    assert "not certified" in listed["0"]["reason"]  # found by its projections, but no inputs given
    assert "not been verified" in listed["1"]["reason"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_module_found_by_structure_is_certified_on_the_inputs_given():
    torch.manual_seed(0)
    model = nn.Sequential(Mixer()).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    y0 = model(x)
    report = surgery.strip_key_bias(model, inputs=((x,), {}))
    assert report["modules_changed"] == ["0"] and model[0].k_proj.bias is None
    assert (model(x) - y0).abs().max() <= 1e-12


def test_a_module_reused_twice_is_handled_once():
    torch.manual_seed(0)
    layer = Mixer().double()
    model = nn.Sequential(layer, layer).eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    y0 = model(x)
    report = surgery.strip_key_bias(model, inputs=((x,), {}))
    assert report["modules_changed"] == ["0"]
    assert (model(x) - y0).abs().max() <= 1e-12


def test_unknown_operation_is_refused():
    from keybias.surgery import _core

    with pytest.raises(ValueError, match="operation"):
        _core.run_surgery(_mha(), "fold_everything", storage="remove")


def test_public_import_and_light_package_import():
    from keybias import fold_value_bias, strip_key_bias

    assert strip_key_bias is surgery.strip_key_bias and fold_value_bias is surgery.fold_value_bias
    code = "import sys, keybias; assert 'torch' not in sys.modules, 'import keybias loaded torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bad_arguments_fail_before_any_work():
    with pytest.raises(ValueError, match="storage"):
        surgery.strip_key_bias(_mha(), storage="nowhere")
    with pytest.raises(TypeError, match="nn.Module"):
        surgery.strip_key_bias("not a model")
