"""Certification as the model calls it: a subclass of a verified class that changes what it does
with the arguments the model passes is caught by its captured calls, whatever its class."""

from __future__ import annotations

import os

import pytest
import torch

from keybias import surgery
from keybias.studies.fixtures import families

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
pytestmark = pytest.mark.filterwarnings("ignore::keybias.surgery.InPlaceWriteWarning",
                                        "ignore::keybias.surgery.FullyMaskedRowWarning")


def _rotary_clip():
    """CLIP text attention (a verified class) subclassed to rotate q and k when the model
    passes position_embeddings, as rotary families do; the model passes them."""
    from transformers.models.clip import modeling_clip

    class RotaryCLIPAttention(modeling_clip.CLIPAttention):
        def forward(self, hidden_states, attention_mask=None, position_embeddings=None, **kwargs):
            b, n, _ = hidden_states.shape
            shape = (b, n, self.num_heads, self.head_dim)
            q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
            k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
            v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
            if position_embeddings is not None:
                cos, sin = position_embeddings

                def rot(t):
                    a, c = t.chunk(2, -1)
                    return t * cos + torch.cat([-c, a], -1) * sin
                q, k = rot(q), rot(k)
            w = (q @ k.transpose(-1, -2)) * self.scale
            if attention_mask is not None:
                w = w + attention_mask
            out = (w.softmax(-1) @ v).transpose(1, 2).reshape(b, n, -1)
            return self.out_proj(out), None

    class Layer(torch.nn.Module):
        def __init__(self, attn):
            super().__init__()
            self.self_attn = attn

        def forward(self, x):
            n, d = x.shape[1], attn.head_dim
            pos = torch.arange(n, dtype=x.dtype)[:, None] / (10.0 ** (torch.arange(d, dtype=x.dtype) / d))
            return self.self_attn(x, position_embeddings=(pos.cos(), pos.sin()))[0]

    model = families.build("CLIP text")
    attn = RotaryCLIPAttention(model.config).double().eval()
    families.randomize_biases(attn, 3)
    return torch.nn.Sequential(Layer(attn))


def test_rotary_subclass_of_a_verified_class_is_refused_on_its_real_calls():
    model = _rotary_clip()
    x = torch.randn(2, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y0 = model(x)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(surgery.SurgeryRefused, match="rotary") as info:
        surgery.strip_key_bias(model, inputs=((x,), {}))
    assert info.value.refusals[0]["change"] > info.value.refusals[0]["tolerance"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # what stripping would have done: the silent failure the captured calls prevent
    stripped = _rotary_clip()
    with torch.no_grad():
        stripped[0].self_attn.k_proj.bias.zero_()
    assert ((stripped(x) - y0).abs().max() / y0.abs().max()) > 1e-3
    # values are not rotated: the fold stays exact and is certified on the same calls
    report = surgery.fold_value_bias(model, inputs=((x,), {}), assume_no_fully_masked_rows=True)
    assert report["modules_changed"] and (model(x) - y0).abs().max() <= 1e-12


def test_rotary_family_fold_is_exact_and_strip_refused_from_the_probe():
    model = families.build("LLaMA attention_bias")
    args, kwargs = families.model_inputs("LLaMA attention_bias", model)
    y0 = families.model_outputs(model, args, kwargs)
    with pytest.raises(surgery.SurgeryRefused, match="rotary"):
        surgery.strip_key_bias(model)
    report = surgery.fold_value_bias(model, assume_no_fully_masked_rows=True)
    assert report["modules_changed"]
    assert (families.model_outputs(model, args, kwargs) - y0).abs().max() <= 1e-12


@pytest.mark.parametrize("family", ["ViT", "CLIP vision", "Whisper", "BART", "GPT-2"])
def test_example_inputs_reach_every_attention_module(family):
    from keybias.surgery import _calls
    from keybias.surgery._sites import discover

    model = families.build(family)
    inputs = _calls.example_inputs(model)
    assert inputs is not None
    sites, _ = discover(model)
    _, calls = _calls.capture(model, inputs, [s.unit_path for s in sites])
    assert all(calls[s.unit_path] for s in sites)
