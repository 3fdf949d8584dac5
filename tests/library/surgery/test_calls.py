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


@pytest.mark.parametrize("family", ["BERT", "GPT-2", "ViT", "BART"])
def test_merged_calls_give_each_calls_own_output(family):
    """The captured and random calls run as one batch give, call by call, what each gives alone."""
    from keybias.surgery import _calls
    from keybias.surgery._sites import discover

    model = families.build(family).double().eval()
    sites, _ = discover(model)
    _, calls = _calls.capture(model, _calls.example_inputs(model), [s.unit_path for s in sites])
    gen = torch.Generator().manual_seed(0)
    merged_any = False
    for site in sites:
        unit = model.get_submodule(site.unit_path) if site.unit_path else model
        probes = list(calls[site.unit_path]) + [_calls.randomized(c, gen) for c in calls[site.unit_path]]
        merged = _calls.merge(probes)
        if merged is None:
            continue
        merged_any = True
        together = _calls.merged_outputs(unit, merged, len(probes))
        alone = [_calls.unit_output(unit, c) for c in probes]
        assert together is not None and len(together) == len(alone)
        for y, ref in zip(together, alone, strict=True):
            assert y.shape == ref.shape and (y - ref).abs().max() <= 1e-12 * (1 + ref.abs().max())
        assert (together[0] - together[-1]).abs().max() > 1e-3  # the random call is another call
    assert merged_any


def test_merge_refuses_calls_it_cannot_join():
    from keybias.surgery import _calls

    x, y = torch.randn(2, 4, 8), torch.randn(2, 5, 8)
    assert _calls.merge([((x,), {}), ((y,), {})]) is None  # shapes differ
    assert _calls.merge([((x,), {"n": 1}), ((x,), {"n": 2})]) is None  # other arguments differ
    assert _calls.merge([((x, torch.randn(3, 4)), {}), ((x, torch.randn(3, 4)), {})]) is None  # dim 0 not the batch
    mask = torch.zeros(1, 1, 4, 4)
    (args, _), batch = _calls.merge([((x, mask), {}), ((x + 1, mask), {})])
    assert batch == 2 and args[0].shape == (4, 4, 8) and args[1] is mask  # broadcast mask kept


def test_a_misjoined_batch_is_caught_and_the_calls_run_one_by_one(monkeypatch):
    """If merging joined the calls wrongly (here: the rows of the batch reversed), the merged
    outputs do not reproduce the captured ones; the site is then certified call by call."""
    from keybias.surgery import _calls, _core

    model = families.build("BERT").eval()
    args, kwargs = families.model_inputs("BERT", model)
    y0 = families.model_outputs(model, args, kwargs)
    real_merge, joined = _calls.merge, []

    def misjoined(calls):
        found = real_merge(calls)
        if found is None:
            return None
        (call_args, call_kwargs), batch = found
        joined.append(batch)
        return ((call_args[0].flip(0), *call_args[1:]), call_kwargs), batch
    singles = []
    real_single = _calls.unit_output
    monkeypatch.setattr(_calls, "merge", misjoined)
    monkeypatch.setattr(_calls, "unit_output", lambda *a, **k: singles.append(1) or real_single(*a, **k))
    seen = []
    real_probe = _core._probe_site
    monkeypatch.setattr(_core, "_probe_site", lambda *a, **k: seen.append(real_probe(*a, **k)) or seen[-1])
    report = surgery.strip_key_bias(model)
    assert joined and report["modules_changed"] and seen and not any(r["batched"] for r in seen) and singles
    assert (families.model_outputs(model, args, kwargs) - y0).abs().max() <= 1e-12 * y0.abs().max()
