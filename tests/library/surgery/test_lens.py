"""TransformerLens HookedTransformer: b_K stripped to exact zeros and b_V folded into b_O,
certified on the model's own calls; rotary models refused. Skipped where transformer-lens is absent."""

from __future__ import annotations

import warnings

import pytest
import torch

from keybias import surgery

lens = pytest.importorskip("transformer_lens")


def _model(seed: int = 0, **kw) -> torch.nn.Module:
    settings = dict(n_layers=2, d_model=32, n_ctx=16, d_head=8, n_heads=4, d_vocab=50, act_fn="gelu",
                    normalization_type="LN", dtype=torch.float64, seed=seed)
    settings.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model = lens.HookedTransformer(lens.HookedTransformerConfig(**settings)).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in model.blocks:
            for name in ("b_Q", "b_K", "b_V", "b_O"):
                param = getattr(block.attn, name)
                param.copy_(torch.randn(param.shape, generator=gen, dtype=param.dtype))
    return model


def _tokens(model, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, model.cfg.d_vocab, (3, 12), generator=torch.Generator().manual_seed(seed))


def test_strip_zeroes_b_K_exactly_and_keeps_the_function():
    model = _model()
    x = _tokens(model)
    y0 = model(x)
    report = surgery.strip_key_bias(model)
    assert report["modules_changed"] == ["blocks.0.attn", "blocks.1.attn"]
    assert report["whole_model"]["holds"]
    for block in model.blocks:
        assert torch.count_nonzero(block.attn.b_K) == 0  # exactly zero, as a Parameter of the same shape
    change = (model(x) - y0).abs().max()
    assert change <= 2.0**-24 * y0.abs().max()
    # the comparison has power: the same size of change on b_Q moves the output
    with torch.no_grad():
        model.blocks[0].attn.b_Q.add_(1.0)
    assert (model(x) - y0).abs().max() > 1e6 * change


def test_fold_matches_transformer_lens_own_fold_and_keeps_the_function():
    model = _model(seed=3)
    x = _tokens(model)
    y0 = model(x)
    theirs = model.fold_value_biases({k: v.clone() for k, v in model.state_dict().items()})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", surgery.FullyMaskedRowWarning)
        report = surgery.fold_value_bias(model)
    assert report["modules_changed"] == ["blocks.0.attn", "blocks.1.attn"]
    for i, block in enumerate(model.blocks):
        assert torch.count_nonzero(block.attn.b_V) == 0
        assert torch.allclose(block.attn.b_O, theirs[f"blocks.{i}.attn.b_O"], rtol=0, atol=1e-12)
    assert (model(x) - y0).abs().max() <= 2.0**-24 * y0.abs().max()


def test_rotary_model_is_refused_naming_rope_and_left_unchanged():
    model = _model(positional_embedding_type="rotary", n_layers=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(surgery.SurgeryRefused, match="RoPE"):
        surgery.strip_key_bias(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # the fold is exact there (values are not rotated) and goes ahead
    x = _tokens(model)
    y0 = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", surgery.FullyMaskedRowWarning)
        surgery.fold_value_bias(model)
    assert (model(x) - y0).abs().max() <= 2.0**-24 * y0.abs().max()


def test_float32_model_is_certified_in_its_own_dtype():
    model = _model(seed=5, dtype=torch.float32)
    report = surgery.strip_key_bias(model)
    check = report["whole_model"]
    assert check["dtype"] == "float32" and check["holds"] and check["change"] <= check["bound"]
