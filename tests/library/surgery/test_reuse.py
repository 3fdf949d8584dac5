"""The fold certified from the strip's float64 copy (the sharded command line's one conversion
per module) gives the numbers a fresh copy gives, and is used only where the copy matches."""

from __future__ import annotations

import copy

import pytest
import torch

from keybias.surgery import _core, _sites, _streamed

transformers = pytest.importorskip("transformers")


def _unit():
    cfg = transformers.OPTConfig(hidden_size=32, num_attention_heads=4, ffn_dim=64, num_hidden_layers=1,
                                 word_embed_proj_dim=32, vocab_size=100)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    unit = transformers.models.opt.modeling_opt.OPTAttention(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in unit.parameters():
            if p.ndim == 1:
                p.normal_(0, 0.5)
    site = _sites.discover(unit)[0][0]
    return unit, _streamed._unit_inputs(unit, site, torch.float32, seed=0)


def _counted(monkeypatch) -> dict:
    made = {"n": 0}
    real = _core._unit_copy

    def counting(unit, calls, buffers=None):
        made["n"] += 1
        return real(unit, calls, buffers)
    monkeypatch.setattr(_core, "_unit_copy", counting)
    return made


def _fold_entry(report: dict) -> tuple:
    m = report["modules"][0]
    return m["action"], m["change"], m["tolerance"]


def test_the_reused_copy_certifies_the_fold_as_a_fresh_copy_does(monkeypatch):
    unit, inputs = _unit()
    made = _counted(monkeypatch)
    reuse: dict = {}
    _core.run_surgery(unit, "strip_key_bias", storage="zeros", inputs=inputs, reuse=reuse)
    fresh_unit = copy.deepcopy(unit)
    reused = _core.run_surgery(unit, "fold_value_bias", storage="zeros", inputs=inputs, reuse=reuse)
    assert made["n"] == 1  # one float64 copy for both tools
    fresh = _core.run_surgery(fresh_unit, "fold_value_bias", storage="zeros", inputs=inputs)
    assert made["n"] == 2
    assert _fold_entry(reused) == _fold_entry(fresh)
    assert _fold_entry(reused)[0] == "folded"
    for a, b in zip(unit.state_dict().values(), fresh_unit.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_a_copy_that_no_longer_matches_the_module_is_not_reused(monkeypatch):
    unit, inputs = _unit()
    made = _counted(monkeypatch)
    reuse: dict = {}
    _core.run_surgery(unit, "strip_key_bias", storage="zeros", inputs=inputs, reuse=reuse)
    with torch.no_grad():
        unit.v_proj.bias.add_(1.0)  # the module moved on after the strip: the copy is stale
    _core.run_surgery(unit, "fold_value_bias", storage="zeros", inputs=inputs, reuse=reuse)
    assert made["n"] == 2
    other, _ = _unit()
    _core.run_surgery(other, "strip_key_bias", storage="zeros", inputs=inputs, reuse=reuse)
    shifted = ((inputs[0][0] + 1.0,), inputs[1])  # other calls than the strip's
    _core.run_surgery(other, "fold_value_bias", storage="zeros", inputs=shifted, reuse=reuse)
    assert made["n"] == 4


def test_recycled_float64_storage_holds_the_new_values_and_is_handed_out_once():
    buffers = _core.Float64Buffers()
    first = torch.nn.Linear(512, 256).eval()
    copy1 = _core._float64_copy(first, buffers)
    assert not buffers.free  # nothing to recycle yet
    buffers.recycle(copy1)
    storage = copy1.weight.data_ptr()
    second = torch.nn.Linear(512, 256).eval()
    copy2 = _core._float64_copy(second, buffers)
    assert copy2.weight.data_ptr() == storage  # converted into the dead copy's storage
    assert torch.equal(copy2.weight, second.weight.double()) and torch.equal(copy2.bias, second.bias.double())
    copy3 = _core._float64_copy(first, buffers)
    assert copy3.weight.data_ptr() != storage  # not handed out again while copy2 lives
    assert torch.equal(copy3.weight, first.weight.double())
