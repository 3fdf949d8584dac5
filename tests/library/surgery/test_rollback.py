"""All-or-nothing: planning and certification before any change, bit-exact rollback on error,
shared and tied parameters handled once or refused by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from keybias import surgery
from keybias.studies.fixtures import families
from keybias.surgery import _core

pytestmark = pytest.mark.filterwarnings("ignore::keybias.surgery.InPlaceWriteWarning",
                                        "ignore::keybias.surgery.FullyMaskedRowWarning")


def _fingerprint(model: nn.Module):
    """Every parameter and buffer: the object, its name and an exact copy of its value, plus
    each module's class (parametrize swaps it)."""
    params = [(n, id(p), p.detach().clone()) for n, p in model.named_parameters(remove_duplicate=False)]
    classes = [(n, type(m)) for n, m in model.named_modules()]
    return params, classes


def _same(a, b) -> bool:
    (pa, ca), (pb, cb) = a, b
    return (ca == cb and len(pa) == len(pb) and
            all(na == nb and ia == ib and torch.equal(va, vb) for (na, ia, va), (nb, ib, vb) in zip(pa, pb, strict=True)))


def _fail_at(monkeypatch, index: int) -> None:
    """Make the `index`-th applied change fail after it was made (when its report entry is
    written), so that the ones before it and this one must be rolled back."""
    applied = []
    real = _core._entry

    def entry(site, action, *args, **kwargs):
        if action in ("removed", "folded"):
            if len(applied) == index:
                raise RuntimeError(f"injected failure at site {index} ({site.name})")
            applied.append(site)
        return real(site, action, *args, **kwargs)

    monkeypatch.setattr(_core, "_entry", entry)


@pytest.mark.parametrize("operation", ["strip_key_bias", "fold_value_bias"])
@pytest.mark.parametrize("name", ["nn.TransformerDecoderLayer", "BERT", "GPT-2"])
def test_injected_failure_midway_restores_bit_exactly(name, operation, monkeypatch):
    model = families.build(name)
    if operation == "fold_value_bias":  # a model that was already stripped (parametrized) rolls back too
        surgery.strip_key_bias(model)
    before = _fingerprint(model)
    with monkeypatch.context() as patch:
        _fail_at(patch, 1)
        with pytest.raises(RuntimeError, match="injected failure at site 1"):
            _core.run_surgery(model, operation, storage="remove", allow_dropout=True)
    assert _same(before, _fingerprint(model))
    # and the model still works, then the real call succeeds
    surgery.strip_key_bias(model) if operation == "strip_key_bias" else surgery.fold_value_bias(model, allow_dropout=True)


def test_rollback_keeps_tied_parameters_tied(monkeypatch):
    model = families.build("BERT")
    model.encoder.layer[1].attention.self.query.weight = model.encoder.layer[0].attention.self.query.weight
    before = _fingerprint(model)
    _fail_at(monkeypatch, 1)
    with pytest.raises(RuntimeError, match="injected failure"):
        _core.run_surgery(model, "strip_key_bias", storage="remove")
    assert _same(before, _fingerprint(model))
    assert model.encoder.layer[1].attention.self.query.weight is model.encoder.layer[0].attention.self.query.weight


def test_shared_value_linear_is_refused_by_name_and_untouched():
    model = families.build("BERT")
    shared = model.encoder.layer[0].attention.self.value
    model.encoder.layer[1].attention.self.value = shared
    before = _fingerprint(model)
    with pytest.raises(surgery.SurgeryRefused, match="shared parameter") as info:
        surgery.fold_value_bias(model, allow_dropout=True)
    message = str(info.value)
    assert "encoder.layer.0.attention.self.value.bias" in message
    assert "encoder.layer.1.attention.self.value.bias" in message
    assert _same(before, _fingerprint(model))


def test_shared_key_linear_is_stripped_once_and_stays_exact():
    model = families.build("BERT")
    model.encoder.layer[1].attention.self.key = model.encoder.layer[0].attention.self.key
    args, kwargs = families.model_inputs("BERT", model)
    y0 = families.model_outputs(model, args, kwargs)
    report = surgery.strip_key_bias(model)
    assert model.encoder.layer[0].attention.self.key.bias is None
    assert report["parameters_saved"] == 16  # one shared vector, freed once
    assert (families.model_outputs(model, args, kwargs) - y0).abs().max() <= 1e-12


def test_modules_sharing_in_proj_bias_are_refused_by_name():
    a, b = nn.MultiheadAttention(8, 2), nn.MultiheadAttention(8, 2)
    b.in_proj_bias = a.in_proj_bias
    model = nn.ModuleDict({"a": a, "b": b}).double()
    before = _fingerprint(model)
    with pytest.raises(surgery.SurgeryRefused, match=r"a\.in_proj_bias.*b\.in_proj_bias"):
        surgery.strip_key_bias(model)
    assert _same(before, _fingerprint(model))


def test_bias_tied_to_a_parameter_outside_attention_is_refused():
    model = families.build("BERT")
    model.pooler.dense.bias = model.encoder.layer[0].attention.self.key.bias
    with pytest.raises(surgery.SurgeryRefused, match="pooler.dense.bias"):
        surgery.strip_key_bias(model)


def test_certification_refuses_a_change_that_moves_the_output():
    from transformers.models.bert.modeling_bert import BertSelfAttention

    class KeyTerm(BertSelfAttention):
        def forward(self, hidden_states, attention_mask=None, **kwargs):
            out, probs = super().forward(hidden_states, attention_mask, **kwargs)
            return out + self.key(hidden_states).sum(-1, keepdim=True), probs

    model = families.build("BERT")
    for layer in model.encoder.layer:
        old = layer.attention.self
        new = KeyTerm(old.config)
        new.load_state_dict(old.state_dict())
        layer.attention.self = new.double().eval()
    before = _fingerprint(model)
    with pytest.raises(surgery.SurgeryRefused, match="depends on b_k") as info:
        surgery.strip_key_bias(model)
    first = info.value.refusals[0]
    assert first["change"] > first["tolerance"] and first["change_over_tolerance"] > 1
    assert _same(before, _fingerprint(model))


def test_nothing_changes_until_every_module_is_certified(monkeypatch):
    """A failed certification of the last module leaves the first ones untouched."""
    model = families.build("nn.TransformerDecoderLayer")
    calls = []
    real = _core.certify

    def certify(unit, site, change, seed=0):
        calls.append(site.name)
        result = real(unit, site, change, seed=seed)
        if site.name == "multihead_attn":
            result = {**result, "certified": False, "change": 1.0}
        return result

    monkeypatch.setattr(_core, "certify", certify)
    before = _fingerprint(model)
    with pytest.raises(surgery.SurgeryRefused, match="multihead_attn"):
        surgery.strip_key_bias(model)
    assert calls == ["self_attn", "multihead_attn"]
    assert _same(before, _fingerprint(model))
