"""Every family of keybias.studies.fixtures.families is handled or refused as the theory says, with accurate reasons."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from keybias import surgery
from keybias.studies.fixtures import families

pytestmark = pytest.mark.filterwarnings("ignore::keybias.surgery.InPlaceWriteWarning")

HANDLED = [n for n, spec in families.FAMILIES.items() if spec[3] == "handled"]
REFUSED = [n for n, spec in families.FAMILIES.items() if spec[3] == "refused"]
REASONS = {
    "BERT relative_key_query": "relative_key_query",
    "LLaMA attention_bias": "rotary",
    "Qwen2": "rotary",
    "DeBERTa-v2": "position-to-content",
    "MHA add_zero_attn": "add_zero_attn",
}


def _outputs(name, model):
    args, kwargs = families.model_inputs(name, model)
    return families.model_outputs(model, args, kwargs)


@pytest.mark.parametrize("name", HANDLED)
def test_handled_family_exact_in_float64(name):
    model = families.build(name)
    y0 = _outputs(name, model)
    strip = surgery.strip_key_bias(model)
    fold = surgery.fold_value_bias(model, allow_dropout=True, assume_no_fully_masked_rows=True)
    assert (_outputs(name, model) - y0).abs().max() <= 1e-12
    assert fold["modules_changed"]
    assert not strip["not_handled"], strip["not_handled"]  # nothing attention-like left unexplained
    for entry in strip["modules"] + fold["modules"]:
        if entry["action"] in ("removed", "folded"):
            assert 0 <= entry["change_over_tolerance"] <= 1 and entry["parameters"]
    if name == "Whisper":  # its k_proj is built without a bias: nothing to strip, for that reason
        assert not strip["modules_changed"]
        assert all("k_proj has no bias" in m["reason"] for m in strip["modules"])
    else:
        assert strip["modules_changed"]


@pytest.mark.parametrize("name", REFUSED)
def test_refused_family_untouched_with_accurate_reason(name):
    model = families.build(name)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(surgery.SurgeryRefused) as info:
        surgery.strip_key_bias(model)
    reasons = " ".join(r["reason"] for r in info.value.refusals)
    assert REASONS[name] in reasons
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    # the refusal is needed: zeroing b_k by hand changes the function
    from keybias.studies.pretrained.measure import _zero_bias_by_hand

    forced = copy.deepcopy(model)
    _zero_bias_by_hand(forced)
    assert (_outputs(name, forced) - _outputs(name, model)).abs().max() > 1e-6


@pytest.mark.parametrize("name", ["CLIP text", "BART", "Whisper"])
def test_no_rotary_blame_where_there_is_no_rotary(name):
    report = surgery.strip_key_bias(families.build(name))
    text = str(report).lower()
    assert "rotary" not in text and "rope" not in text


def test_relative_key_is_redundant_and_handled():
    """relative_key adds only q_i . r_(i-j): b_k stays a row constant, so the strip is exact,
    while the same model with relative_key_query is refused (and rightly: see the test above)."""
    model = families.build("BERT relative_key")
    assert model.encoder.layer[0].attention.self.position_embedding_type == "relative_key"
    y0 = _outputs("BERT relative_key", model)
    surgery.strip_key_bias(model)
    assert (_outputs("BERT relative_key", model) - y0).abs().max() <= 1e-12


def test_gpt2_strips_the_key_third_of_c_attn():
    model = families.build("GPT-2")
    e = model.config.n_embd
    bias = model.h[0].attn.c_attn.bias.detach().clone()
    report = surgery.strip_key_bias(model)
    assert report["parameters_saved"] == model.config.n_layer * e
    now = model.h[0].attn.c_attn.bias
    assert torch.equal(now[:e], bias[:e]) and torch.equal(now[2 * e:], bias[2 * e:])
    assert torch.count_nonzero(now[e:2 * e]) == 0
    assert report["parameters_removed"][0] == "h.0.attn.c_attn.bias[16:32]"


def test_quantizable_mha_acts_on_linear_k_and_linear_v():
    model = families.build("quantizable MHA")
    y0 = _outputs("quantizable MHA", model)
    surgery.strip_key_bias(model)
    surgery.fold_value_bias(model, assume_no_fully_masked_rows=True)
    assert model.linear_K.bias is None and model.linear_V.bias is None
    assert (_outputs("quantizable MHA", model) - y0).abs().max() <= 1e-12


def test_certification_catches_pytorch_quantizable_batch_first_fold():
    """torch.ao's quantizable MHA with batch_first=True reshapes its heads with a bare view,
    which mixes heads and positions: b_v is no longer a per-row constant there, the fold
    changes the output, and certification refuses it (the strip stays exact)."""
    model = torch.ao.nn.quantizable.MultiheadAttention(16, 2, batch_first=True)
    families.randomize_biases(model, 0).double().eval()
    surgery.strip_key_bias(model)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(surgery.SurgeryRefused, match="certification failed") as info:
        surgery.fold_value_bias(model, assume_no_fully_masked_rows=True)
    refusal = info.value.refusals[0]
    assert refusal["change"] > refusal["tolerance"] > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_reused_class_is_handled_like_its_base():
    """A subclass of a verified class (a model that reuses BERT's attention) is handled."""
    from transformers.models.bert.modeling_bert import BertSelfAttention

    model = families.build("BERT")

    class MyAttention(BertSelfAttention):
        pass

    for layer in model.encoder.layer:
        old = layer.attention.self
        new = MyAttention(old.config)
        new.load_state_dict(old.state_dict())
        layer.attention.self = new.double().eval()
    y0 = _outputs("BERT", model)
    report = surgery.strip_key_bias(model)
    assert len(report["modules_changed"]) == 2
    assert (_outputs("BERT", model) - y0).abs().max() <= 1e-12


def test_families_load_offline_and_quietly():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("BERT", "GPT-2"):
            families.build(name)
    with pytest.raises(ValueError, match="unknown family"):
        families.build("no such model")
