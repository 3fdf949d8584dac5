"""The README's command line examples, one per folder format, run as written on tiny folders of
that format: each exits 0, and the MiniLM one is refused without the flag its comment names."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch

from keybias.surgery import cli

README = Path(__file__).resolve().parents[3] / "README.md"


def _examples() -> list[list[str]]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## The surgery tool"):]
    block = section[section.index("One command per folder format"):]
    block = block[block.index("```sh") + len("```sh"):]
    block = block[:block.index("```")]
    return [shlex.split(line)[1:] for line in block.splitlines() if line.startswith("keybias-surgery ")]


def _hf(directory: Path) -> None:
    from keybias.studies.fixtures import families

    model = families.build("BERT").float()
    assert model.config.attention_probs_dropout_prob > 0  # as MiniLM's config
    model.save_pretrained(str(directory), safe_serialization=True)


def _sharded(directory: Path) -> None:
    import transformers

    cfg = transformers.OPTConfig(hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
                                 word_embed_proj_dim=32, vocab_size=100, max_position_embeddings=32)
    cfg.architectures = ["OPTForCausalLM"]
    transformers.OPTForCausalLM(cfg).save_pretrained(str(directory), safe_serialization=True, max_shard_size="40KB")
    assert (directory / "model.safetensors.index.json").is_file()


def _timm(directory: Path) -> None:
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    args = {"img_size": 32, "patch_size": 8, "depth": 1}
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, **args)
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224", "num_classes": 0,
                                                       "model_args": args}))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))


def _open_clip(directory: Path) -> None:
    pytest.importorskip("open_clip")
    from open_clip import model as oc_model
    from safetensors.torch import save_file

    cfg = {"embed_dim": 32, "vision_cfg": {"image_size": 32, "patch_size": 8, "width": 64, "layers": 1,
                                           "head_width": 32},
           "text_cfg": {"context_length": 8, "vocab_size": 100, "width": 64, "heads": 2, "layers": 1}}
    torch.manual_seed(0)
    model = oc_model.CLIP(**cfg)
    directory.mkdir()
    (directory / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(directory / "open_clip_model.safetensors"))


BUILDERS = {"minilm": _hf, "vit-timm": _timm, "clip-open_clip": _open_clip, "opt-sharded": _sharded}


def test_the_readme_shows_one_example_per_folder_format():
    assert sorted(argv[0] for argv in _examples()) == sorted(BUILDERS)


@pytest.mark.parametrize("argv", _examples(), ids=lambda argv: argv[0])
def test_each_readme_example_runs_as_written(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    BUILDERS[argv[0]](tmp_path / argv[0])
    assert cli._format(tmp_path / argv[0]) == {"minilm": "hf", "opt-sharded": "hf", "vit-timm": "timm",
                                                 "clip-open_clip": "open_clip"}[argv[0]]
    if "--allow-dropout" in argv:  # the comment's reason for the flag holds: without it, refused
        assert cli.main([a for a in argv if a != "--allow-dropout"]) == 2
        assert "attention dropout is configured" in capsys.readouterr().err
    assert cli.main(argv) == 0
    assert (tmp_path / argv[1] / "keybias_surgery.json").is_file()
