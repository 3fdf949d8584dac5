"""python -m keybias.surgery on a sharded checkpoint: one module and one shard at a time, the same
result as the whole-model path, and the sharded checkpoint's own ways of being wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from keybias.surgery import _shards, cli

transformers = pytest.importorskip("transformers")


def _opt(dropout: float = 0.0):
    cfg = transformers.OPTConfig(hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
                                 word_embed_proj_dim=32, vocab_size=100, max_position_embeddings=32,
                                 attention_dropout=dropout)
    cfg.architectures = ["OPTForCausalLM"]
    torch.manual_seed(0)
    model = transformers.OPTForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" not in name:
                p.normal_(0, 0.5)  # large biases: a wrong change to one shows
    return model.eval()


def _save(model, directory: Path, sharded: bool = True) -> Path:
    model.save_pretrained(str(directory), safe_serialization=True, max_shard_size="40KB" if sharded else "5GB")
    assert (directory / _shards.INDEX).exists() == sharded
    return directory


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(path)))
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same float32 checkpoint, sharded and in one file, each through the command line."""
    root = tmp_path_factory.mktemp("sharded")
    model = _opt()
    sharded, single = _save(model, root / "sharded"), _save(model, root / "single", sharded=False)
    assert cli.main([str(sharded), str(root / "sharded-out"), "--fold-value"]) == 0
    assert cli.main([str(single), str(root / "single-out"), "--fold-value"]) == 0
    return model, root


def test_sharded_output_equals_the_whole_model_path_tensor_for_tensor(pair):
    _model, root = pair
    a, b = _tensors(root / "sharded-out"), _tensors(root / "single-out")
    assert set(a) == set(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert len(list((root / "sharded-out").glob("*.safetensors"))) > 1  # still sharded
    index = json.loads((root / "sharded-out" / _shards.INDEX).read_text())
    assert set(index["weight_map"]) == set(a)


def test_sharded_output_loads_and_computes_the_same_function(pair):
    model, root = pair
    out = transformers.OPTForCausalLM.from_pretrained(str(root / "sharded-out"), local_files_only=True).eval()
    for layer in out.model.decoder.layers:
        assert torch.count_nonzero(layer.self_attn.k_proj.bias) == 0
        assert torch.count_nonzero(layer.self_attn.v_proj.bias) == 0
    ids = torch.randint(4, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before, after = model(ids).logits, out(ids).logits
    # float32 rounding of O(1) logits; the folded b_o is rounded once to float32
    assert (before - after).abs().max() <= 1e-4 * before.abs().max()
    # power: the same comparison sees a folded output bias that is off by 0.05 (a random direction:
    # the layer norms would hide a constant shift)
    with torch.no_grad():
        bias = out.model.decoder.layers[0].self_attn.out_proj.bias
        bias.add_(0.05 * torch.randn(bias.shape, generator=torch.Generator().manual_seed(2)))
        moved = out(ids).logits
    assert (before - moved).abs().max() > 1e-3 * before.abs().max()


def test_each_input_byte_is_read_once_and_only_attention_tensors_enter_the_process(tmp_path, monkeypatch):
    """The model is never loaded: each shard is streamed once; the only tensors read into the
    process are those of the attention modules the tools change, each once; the rest of the
    bytes are copied by the kernel."""
    src = _save(_opt(), tmp_path / "in")
    read: list[str] = []
    streamed: list[str] = []
    real = _shards.stream_shard

    def spy(source, target, wanted, deliver, stop=None, take=None):
        streamed.append(source.name)

        def counted(name, tensor):
            read.append(name)
            deliver(name, tensor)
        return real(source, target, wanted, counted, stop, take)
    monkeypatch.setattr(_shards, "stream_shard", spy)
    assert cli.main([str(src), str(tmp_path / "out"), "--fold-value"]) == 0
    assert sorted(streamed) == sorted(p.name for p in src.glob("*.safetensors"))
    assert read and all(".self_attn." in name for name in read)
    assert len(read) == len(set(read)) == 2 * 8  # two layers, four projections with weight and bias


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def _missing_shard(src: Path) -> str:
    shard = sorted(src.glob("*.safetensors"))[-1]
    shard.unlink()
    return shard.name


def _absent_tensor(src: Path) -> str:
    index = json.loads((src / _shards.INDEX).read_text())
    index["weight_map"]["model.decoder.layers.9.fc1.weight"] = sorted(set(index["weight_map"].values()))[0]
    (src / _shards.INDEX).write_text(json.dumps(index))
    return "model.decoder.layers.9.fc1.weight"


def _moved_tensor(src: Path) -> str:
    index = json.loads((src / _shards.INDEX).read_text())
    shards = sorted(set(index["weight_map"].values()))
    name = next(k for k, v in index["weight_map"].items() if v == shards[0])
    index["weight_map"][name] = shards[1]
    (src / _shards.INDEX).write_text(json.dumps(index))
    return name


def _unindexed_file(src: Path) -> str:
    from safetensors.torch import save_file

    save_file({"extra": torch.zeros(2)}, str(src / "extra.safetensors"))
    return "extra.safetensors"


def _bad_index(src: Path) -> str:
    (src / _shards.INDEX).write_text('{"metadata": {}}')
    return "no weight_map"


def _truncated_shard(src: Path) -> str:
    shard = sorted(src.glob("*.safetensors"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    return "truncated"


def _dropout(src: Path) -> str:
    cfg = json.loads((src / "config.json").read_text())
    cfg["attention_dropout"] = 0.1
    (src / "config.json").write_text(json.dumps(cfg))
    return "--allow-dropout"


def _config(src: Path, **changes) -> None:
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(changes)
    (src / "config.json").write_text(json.dumps(cfg))


def _missing_tensors(src: Path) -> str:
    _config(src, num_hidden_layers=3)  # the checkpoint has two layers
    return "missing from the checkpoint (model.decoder.layers.2."


def _unexpected_tensors(src: Path) -> str:
    _config(src, num_hidden_layers=1)
    return "unexpected tensors that the architecture does not use (model.decoder.layers.1."


def _shape_mismatch(src: Path) -> str:
    _config(src, ffn_dim=48)
    return "shape mismatch: model.decoder.layers.0.fc1.bias is (64,) in the checkpoint but (48,) in config.json"


def _mixed_float_dtypes(src: Path) -> str:
    from safetensors.torch import load_file, save_file

    shard = sorted(src.glob("*.safetensors"))[-1]
    tensors = load_file(shard)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].half()
    save_file(tensors, shard, metadata={"format": "pt"})
    return "a sharded checkpoint must hold one float dtype"


def _with_dtype(src: Path) -> str:
    return "--dtype cannot be used with a sharded checkpoint"


SHARD_CASES = {"missing_shard": _missing_shard, "index_names_absent_tensor": _absent_tensor,
               "tensor_in_another_shard": _moved_tensor, "file_not_in_index": _unindexed_file,
               "index_without_weight_map": _bad_index, "truncated_shard": _truncated_shard,
               "attention_dropout": _dropout, "dtype_with_shards": _with_dtype, "missing_tensors": _missing_tensors,
               "unexpected_tensors": _unexpected_tensors, "shape_mismatch": _shape_mismatch,
               "mixed_float_dtypes": _mixed_float_dtypes}


@pytest.mark.parametrize("case", sorted(SHARD_CASES))
def test_bad_sharded_checkpoint_exits_2_in_one_line_and_writes_nothing(tmp_path, case, capsys):
    src = _save(_opt(), tmp_path / "in")
    expected = SHARD_CASES[case](src)
    capsys.readouterr()  # what writing the input printed
    argv = [str(src), str(tmp_path / "out"), "--fold-value"] + (["--dtype", "float32"] if case == "dtype_with_shards"
                                                                  else [])
    assert cli.main(argv) == 2
    err = _one_line(capsys)
    assert expected in err and "internal" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_attention_dropout_is_folded_only_with_the_flag_in_both_paths(tmp_path, capsys):
    model = _opt(dropout=0.1)
    for sharded in (True, False):
        src = _save(model, tmp_path / f"in-{sharded}", sharded=sharded)
        capsys.readouterr()  # the progress bar of saving, which is not the tool's
        assert cli.main([str(src), str(tmp_path / f"out-{sharded}"), "--fold-value"]) == 2
        err = _one_line(capsys)
        assert "attention dropout" in err and "--allow-dropout" in err and "config.json attention_dropout=0.1" in err
        assert not (tmp_path / f"out-{sharded}").exists()
        assert cli.main([str(src), str(tmp_path / f"out-{sharded}"), "--fold-value", "--allow-dropout"]) == 0
        # both paths say what the fold does not keep: a fully masked row, and dropout in training mode
        said = capsys.readouterr().out
        assert "fully masked query row" in said and "eval mode only" in said, (sharded, said)
    a, b = _tensors(tmp_path / "out-True"), _tensors(tmp_path / "out-False")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_allow_dropout_without_fold_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([str(tmp_path / "a"), str(tmp_path / "b"), "--allow-dropout"])
    assert info.value.code == 2
    assert "--allow-dropout only applies with --fold-value" in _one_line(capsys)


def test_a_shard_interrupted_mid_write_leaves_nothing_and_a_rerun_finishes(tmp_path, monkeypatch, capsys):
    src = _save(_opt(), tmp_path / "in")
    out = tmp_path / "out"
    real = _shards.stream_shard
    calls = {"n": 0}

    def interrupted(source, target, wanted, deliver, stop=None, take=None):
        calls["n"] += 1
        if calls["n"] == 2:  # the second shard: half of it written, then Ctrl-C
            target.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
            raise KeyboardInterrupt
        return real(source, target, wanted, deliver, stop, take)
    monkeypatch.setattr(_shards, "stream_shard", interrupted)
    assert cli.main([str(src), str(out), "--fold-value"]) == cli.EXIT_INTERRUPTED
    assert "interrupted; nothing written" in _one_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
    monkeypatch.setattr(_shards, "stream_shard", real)
    assert cli.main([str(src), str(out), "--fold-value"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]


def _streamed_copy(tmp_path: Path):
    """A shard of the test model streamed to a copy, with its first 1-D tensor changed."""
    src = _save(_opt(), tmp_path / "in")
    shard = sorted(src.glob("*.safetensors"))[0]
    start, table = _shards.header(shard)
    name = next(k for k, v in sorted(table.items()) if len(v["shape"]) == 1 and v["dtype"] == "F32")
    copy = tmp_path / "copy.safetensors"
    _shards.stream_shard(shard, copy, set(), lambda *_: None)
    change = {name: torch.arange(table[name]["shape"][0], dtype=torch.float32)}
    _shards.patch(shard, copy, change)
    _shards.check_written(shard, copy, change)
    return shard, copy, change, start, table


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["first byte of a tensor", "last byte of the file", "changed tensor", "header",
                                   "cut short"])
def test_the_written_check_catches_what_it_promises(tmp_path, where):
    shard, copy, change, start, table = _streamed_copy(tmp_path)
    from safetensors.torch import load_file

    written = load_file(str(copy))
    for k, v in load_file(str(shard)).items():  # the check passed on a copy that is right
        assert torch.equal(written[k], change.get(k, v)), k
    name = next(iter(change))
    other = next(k for k in table if k != name)
    if where == "first byte of a tensor":
        _flip(copy, start + table[other]["data_offsets"][0])
    elif where == "last byte of the file":
        _flip(copy, copy.stat().st_size - 1)
    elif where == "changed tensor":
        _flip(copy, start + table[name]["data_offsets"][0] + 1)
    elif where == "header":
        _flip(copy, 10)
    else:
        copy.write_bytes(copy.read_bytes()[:-3])
    with pytest.raises(_shards.CheckpointError, match="different|header|bytes"):
        _shards.check_written(shard, copy, change)


def test_long_messages_of_other_libraries_are_cut_visibly_and_can_be_shown_whole(monkeypatch):
    text = "word " * 200
    cut = cli.clip(text)
    assert cut.endswith(f"{cli.FULL_MESSAGES}=1 shows it whole)") and "…" in cut and len(cut) < len(text)
    assert cli.clip("short reason") == "short reason"
    monkeypatch.setenv(cli.FULL_MESSAGES, "1")
    assert cli.clip(text) == " ".join(text.split())


def test_sharded_nan_module_is_left_and_the_reason_names_the_nan_tensor(tmp_path, capsys):
    model = _opt()
    bad = "model.decoder.layers.1.self_attn.k_proj.weight"
    with torch.no_grad():
        model.get_parameter(bad)[0, 0] = float("nan")
    src = _save(model, tmp_path / "in")
    assert cli.main([str(src), str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if "not handled" in x and "layers.1.self_attn" in x)
    assert f"its weights hold NaN (tensor {bad})" in line, line
    assert "exercised nothing" not in text
    summary = json.loads((tmp_path / "out" / "keybias_surgery.json").read_text())
    strip = summary["reports"][0]
    assert "model.decoder.layers.0.self_attn" in strip["modules_changed"]
    assert not any("layers.1." in m for m in strip["modules_changed"])
    written, stored = _tensors(tmp_path / "out"), _tensors(src)
    key = "model.decoder.layers.1.self_attn.k_proj.bias"
    assert torch.equal(written[key], stored[key])  # its key bias left as it is
