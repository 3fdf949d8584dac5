"""timm models: inputs from pretrained_cfg (no inputs= needed), attention dropout refused for
the fold, BEiT/EVA's separate v_bias folded, ConViT's MHSA stripped and GPSA reported, EVA's
AttentionRope refused as RoPE, SigLIP's MAP head stripped (refused with QK-norm).
Skipped where timm is not installed (keybias[timm])."""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from pathlib import Path

import pytest
import torch

from keybias import surgery

if importlib.util.find_spec("timm") is None:
    pytest.skip("timm is not installed (pip install 'keybias[timm]')", allow_module_level=True)
timm = importlib.import_module("timm")


def _build(name: str, seed: int = 0, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False, num_classes=0, **kw).double().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.ndim == 1 and "bias" in pname:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def _image(model, seed: int = 1) -> torch.Tensor:
    size = tuple(model.patch_embed.img_size)
    return torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


TINY = dict(img_size=32, patch_size=8, depth=2)


def _quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", surgery.FullyMaskedRowWarning)
        return fn(*args, **kw)


def test_vit_is_certified_from_its_pretrained_cfg_without_inputs():
    model = _build("vit_tiny_patch16_224", **TINY)
    x = _image(model)
    y0 = model(x)
    strip = surgery.strip_key_bias(model, storage="zeros")
    fold = _quiet(surgery.fold_value_bias, model, storage="zeros")
    assert strip["modules_changed"] == fold["modules_changed"] == ["blocks.0.attn", "blocks.1.attn"]
    assert strip["whole_model"]["holds"] and not strip["not_handled"]
    assert (model(x) - y0).abs().max() <= 2.0**-24 * y0.abs().max()
    with torch.no_grad():  # power: a change of b_q of the same kind moves the output
        model.blocks[0].attn.qkv.bias[:8].add_(1.0)
    assert (model(x) - y0).abs().max() > 1e-6 * y0.abs().max()


def test_timm_attention_dropout_is_read_and_refused_for_the_fold():
    model = _build("vit_tiny_patch16_224", attn_drop_rate=0.1, **TINY)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(surgery.SurgeryRefused, match="attention dropout p=0.1"):
        _quiet(surgery.fold_value_bias, model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert _quiet(surgery.fold_value_bias, model, allow_dropout=True)["modules_changed"]
    # the strip does not need rows that sum to one: dropout does not stop it
    assert surgery.strip_key_bias(_build("vit_tiny_patch16_224", attn_drop_rate=0.1, **TINY))["modules_changed"]


@pytest.mark.parametrize("name", ["beit_base_patch16_224", "eva02_tiny_patch14_224"])
def test_beit_and_eva_separate_v_bias_is_folded(name):
    kw = dict(img_size=28, patch_size=14, depth=2) if name.startswith("eva") else dict(
        img_size=32, patch_size=8, depth=2, embed_dim=64, num_heads=4)
    model = _build(name, **kw)
    x = _image(model)
    y0 = model(x)
    strip = surgery.strip_key_bias(model)
    assert not strip["modules_changed"] and "k_bias is a zero buffer" in strip["unchanged"][0]["reason"]
    fold = _quiet(surgery.fold_value_bias, model)
    assert fold["modules_changed"] == ["blocks.0.attn", "blocks.1.attn"]
    for block in model.blocks:
        assert torch.count_nonzero(block.attn.v_bias) == 0
    assert (model(x) - y0).abs().max() <= 2.0**-24 * y0.abs().max()


def test_convit_mhsa_is_stripped_and_gpsa_reported_with_its_reason():
    model = _build("convit_tiny", local_up_to_layer=1, qkv_bias=True, **TINY)
    x = _image(model)
    y0 = model(x)
    report = surgery.strip_key_bias(model, storage="zeros")
    assert report["modules_changed"] == ["blocks.1.attn"]  # MHSA: packed [q | k | v] qkv
    qkv = model.blocks[1].attn.qkv.bias
    dim = qkv.numel() // 3
    assert torch.count_nonzero(qkv[dim:2 * dim]) == 0 and torch.count_nonzero(qkv[:dim]) > 0
    assert (model(x) - y0).abs().max() <= 2.0**-24 * y0.abs().max()
    gpsa = [u for u in report["not_handled"] if u["module"] == "blocks.0.attn"]
    assert gpsa and "GPSA" in gpsa[0]["reason"] and "gate" in gpsa[0]["reason"]
    with torch.no_grad():  # power: the same kind of change to b_q moves the output
        qkv[:dim].add_(1.0)
    assert (model(x) - y0).abs().max() > 1e-6 * y0.abs().max()


def test_rope_attention_is_refused_naming_rope():
    model = _build("vit_small_patch16_rope_224", img_size=32, patch_size=8, depth=1)
    with pytest.raises(surgery.SurgeryRefused, match=r"RoPE") as info:
        surgery.strip_key_bias(model)
    assert "QK-norm" not in str(info.value)


def test_map_pooling_head_key_bias_is_stripped_and_its_value_bias_folded():
    """SigLIP's MAP head (AttentionPoolLatent): q from a learned latent, [k | v] from kv."""
    kw = dict(img_size=32, patch_size=8, depth=1, embed_dim=64, num_heads=4)
    model = _build("vit_base_patch16_siglip_224", **kw)
    x = _image(model)
    y0 = model(x)
    strip = surgery.strip_key_bias(model, storage="zeros")
    fold = _quiet(surgery.fold_value_bias, model, storage="zeros")
    assert strip["modules_changed"] == fold["modules_changed"] == ["blocks.0.attn", "attn_pool"]
    assert not strip["not_handled"]
    kv = model.attn_pool.kv.bias
    assert torch.count_nonzero(kv) == 0 and torch.count_nonzero(model.attn_pool.q.bias) > 0
    assert (model(x) - y0).abs().max() <= 2.0**-24 * y0.abs().max()
    with torch.no_grad():  # power: the same change to b_q of the head moves the output
        model.attn_pool.q.bias.add_(1.0)
    assert (model(x) - y0).abs().max() > 1e-6 * y0.abs().max()


def test_map_pooling_head_with_qk_norm_is_refused_naming_qk_norm():
    from timm.layers import AttentionPoolLatent

    torch.manual_seed(0)
    head = AttentionPoolLatent(64, num_heads=4, qk_norm=True).double().eval()
    with torch.no_grad():
        head.kv.bias.normal_()
    with pytest.raises(surgery.SurgeryRefused, match="QK-norm"):
        surgery.strip_key_bias(head, inputs=torch.randn(2, 5, 64, dtype=torch.float64))


def _timm_folder(directory: Path, drop: str | None = None) -> Path:
    import json

    from safetensors.torch import save_file

    args = {"img_size": 32, "patch_size": 8, "depth": 2}
    model = _build("vit_tiny_patch16_224", **args).float()
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224", "num_classes": 0,
                                                       "model_args": args}))
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != drop}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def test_cli_takes_timm_hf_folder_format(tmp_path):
    from safetensors.torch import load_file

    from keybias.surgery import cli

    src, out = _timm_folder(tmp_path / "in"), tmp_path / "out"
    assert cli.main([str(src), str(out), "--fold-value"]) == 0
    written = load_file(str(out / "model.safetensors"))
    dim = written["blocks.0.attn.qkv.bias"].numel() // 3
    assert torch.count_nonzero(written["blocks.0.attn.qkv.bias"][dim:]) == 0  # b_k and b_v
    assert torch.count_nonzero(written["blocks.0.attn.qkv.bias"][:dim]) > 0  # b_q stays
    assert (out / "config.json").is_file() and (out / "keybias_surgery.json").is_file()


def test_cli_timm_folder_missing_a_tensor_exits_2(tmp_path, capsys):
    from keybias.surgery import cli

    src, out = _timm_folder(tmp_path / "in", drop="blocks.1.attn.proj.bias"), tmp_path / "out"
    assert cli.main([str(src), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "blocks.1.attn.proj.bias" in err and "missing" in err
    assert not out.exists()


def test_cli_takes_open_clip_format(tmp_path):
    import json

    pytest.importorskip("open_clip")
    from open_clip import model as oc_model
    from safetensors.torch import load_file, save_file

    from keybias.surgery import cli

    cfg = {"embed_dim": 32, "vision_cfg": {"image_size": 32, "patch_size": 8, "width": 64, "layers": 1,
                                           "head_width": 32},
           "text_cfg": {"context_length": 8, "vocab_size": 100, "width": 64, "heads": 2, "layers": 1}}
    torch.manual_seed(0)
    model = oc_model.CLIP(**cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("in_proj_bias"):
                p.normal_()
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    (src / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(src / "open_clip_model.safetensors"))
    assert cli.main([str(src), str(out), "--fold-value"]) == 0
    written = load_file(str(out / "open_clip_model.safetensors"))
    bias = written["transformer.resblocks.0.attn.in_proj_bias"]
    assert torch.count_nonzero(bias[64:]) == 0 and torch.count_nonzero(bias[:64]) > 0


def test_open_clip_folder_with_transformers_weights_reads_only_open_clip_file(tmp_path, capsys):
    """Laion's Hub folders hold open_clip's file and transformers' model.safetensors side by side."""
    import json

    pytest.importorskip("open_clip")
    from open_clip import model as oc_model
    from safetensors.torch import load_file, save_file

    from keybias.surgery import cli

    cfg = {"embed_dim": 32, "vision_cfg": {"image_size": 32, "patch_size": 8, "width": 64, "layers": 1,
                                           "head_width": 32},
           "text_cfg": {"context_length": 8, "vocab_size": 100, "width": 64, "heads": 2, "layers": 1}}
    torch.manual_seed(0)
    model = oc_model.CLIP(**cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("in_proj_bias"):
                p.normal_()
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    (src / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(src / "open_clip_model.safetensors"))
    # transformers' names for the same model: tensors open_clip would call unexpected
    save_file({"text_model.embeddings.token_embedding.weight": torch.zeros(100, 64)}, str(src / "model.safetensors"))
    assert cli.main([str(src), str(out)]) == 0
    text = capsys.readouterr().out
    assert "read open_clip_model.safetensors" in text and "ignored model.safetensors" in text
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["open_clip_model.safetensors"]
    assert json.loads((out / "keybias_surgery.json").read_text())["ignored_files"] == ["model.safetensors"]
    bias = load_file(str(out / "open_clip_model.safetensors"))["transformer.resblocks.0.attn.in_proj_bias"]
    assert torch.count_nonzero(bias[64:128]) == 0 and torch.count_nonzero(bias[:64]) > 0

    # open_clip's own choice where its file is a pickle: refused, in one line, nothing written
    (src / "open_clip_model.safetensors").rename(src / "kept.safetensors.bak")
    torch.save({}, src / "open_clip_pytorch_model.bin")
    assert cli.main([str(src), str(tmp_path / "out2")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "open_clip_pytorch_model.bin" in err and "pickle" in err
    assert not (tmp_path / "out2").exists()
