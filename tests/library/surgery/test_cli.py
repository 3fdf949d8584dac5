"""python -m keybias.surgery: MiniLM round trip, and clear errors that leave nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from keybias.studies.fixtures import families
from keybias.studies.pretrained import measure as pretrained
from keybias.surgery import cli


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "minilm-stripped"
    lines: list[str] = []
    summary = cli.convert(pretrained.model_path(), out, fold_value=True, allow_dropout=True, log=lines.append)
    return out, summary, "\n".join(lines)


def test_minilm_round_trip_loads_with_transformers_and_sentence_transformers(converted):
    out, summary, log = converted
    assert summary["whole_model_check"]["holds"]
    assert "strip_key_bias:" in log and "fold_value_bias:" in log and "wrote" in log
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(out), local_files_only=True, use_safetensors=True)
    for layer in model.encoder.layer:
        assert torch.count_nonzero(layer.attention.self.key.bias) == 0
        assert torch.count_nonzero(layer.attention.self.value.bias) == 0
    st = pytest.importorskip("sentence_transformers")
    texts = pretrained.sentences(12, 0)
    original = st.SentenceTransformer(str(pretrained.model_path()), device="cpu", local_files_only=True)
    stripped = st.SentenceTransformer(str(out), device="cpu", local_files_only=True)
    a = torch.as_tensor(original.encode(texts, convert_to_numpy=True))
    b = torch.as_tensor(stripped.encode(texts, convert_to_numpy=True))
    # unit vectors in float32: a change of a few float32 ulps of an O(1) number is rounding
    assert (a - b).abs().max() <= 1e-5
    # the comparison has power: a model with its query biases changed does not pass it
    with torch.no_grad():
        for layer in stripped[0].auto_model.encoder.layer:
            layer.attention.self.query.bias.add_(0.05)
    c = torch.as_tensor(stripped.encode(texts, convert_to_numpy=True))
    assert (a - c).abs().max() > 1e-3


def _write_tiny(directory: Path, family: str) -> Path:
    model = families.build(family).float()
    model.save_pretrained(str(directory), safe_serialization=True)
    return directory


CASES = ["missing", "not_a_dir", "no_config", "no_safetensors", "pickle_only", "refused_architecture",
         "nothing_handled", "output_exists", "corrupt_config", "empty_safetensors", "truncated_safetensors",
         "unwritable_parent", "out_inside_in", "non_text"]


def _patchtst(directory: Path) -> None:
    import transformers

    cfg = transformers.PatchTSTConfig(num_input_channels=2, context_length=16, patch_length=4, patch_stride=4,
                                      d_model=16, num_attention_heads=2, num_hidden_layers=1, ffn_dim=32)
    transformers.PatchTSTModel(cfg).save_pretrained(str(directory), safe_serialization=True)


@pytest.mark.parametrize("case", CASES)
def test_bad_input_fails_clearly_and_leaves_nothing(tmp_path, case, capsys):
    src, out = tmp_path / "in", tmp_path / "out"
    expected = {"missing": "does not exist", "not_a_dir": "not a directory", "no_config": "no config.json",
                "no_safetensors": "no *.safetensors", "pickle_only": "only pickle checkpoints",
                "refused_architecture": "rotary", "nothing_handled": "no attention module this tool handles",
                "output_exists": "already exists", "corrupt_config": "not valid JSON",
                "empty_safetensors": "empty or truncated", "truncated_safetensors": "truncated",
                "unwritable_parent": "not writable", "out_inside_in": "inside the input",
                "non_text": "builds inputs for models that take"}[case]
    if case == "nothing_handled":
        expected = "no key bias to remove"
    if case == "not_a_dir":
        src.write_text("x")
    elif case in ("no_config", "no_safetensors", "pickle_only"):
        src.mkdir()
        if case != "no_config":
            (src / "config.json").write_text('{"model_type": "bert"}')
        if case == "pickle_only":
            (src / "pytorch_model.bin").write_bytes(b"never unpickled")
    elif case == "refused_architecture":
        _write_tiny(src, "LLaMA attention_bias")
    elif case == "nothing_handled":
        import transformers

        cfg = transformers.LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                       num_key_value_heads=2, intermediate_size=32, vocab_size=40)
        transformers.LlamaModel(cfg).save_pretrained(str(src), safe_serialization=True)
    elif case == "output_exists":
        _write_tiny(src, "BERT")
        out.mkdir()
    elif case == "corrupt_config":
        _write_tiny(src, "BERT")
        (src / "config.json").write_text('{"model_type": "bert", ')
    elif case in ("empty_safetensors", "truncated_safetensors"):
        _write_tiny(src, "BERT")
        weights = src / "model.safetensors"
        data = weights.read_bytes()
        weights.write_bytes(b"" if case == "empty_safetensors" else data[: len(data) // 2])
    elif case == "unwritable_parent":
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only folder")
        _write_tiny(src, "BERT")
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        out = locked / "out"
    elif case == "out_inside_in":
        _write_tiny(src, "BERT")
        out = src / "stripped"
    elif case == "non_text":
        _patchtst(src)
    before = _leftovers(tmp_path)
    capsys.readouterr()  # what writing the input printed
    code = cli.main([str(src), str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error:") and expected in err
    assert _leftovers(tmp_path) == before  # no output, no temporary folder
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    if case != "output_exists":
        assert not out.exists()


def test_stale_temporary_folder_of_a_killed_run_is_removed(tmp_path, capsys):
    src, out = _write_tiny(tmp_path / "in", "BERT"), tmp_path / "out"
    stale = tmp_path / f".out{cli.TEMP_TAG}999999999"  # no such process
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    lines: list[str] = []
    cli.convert(src, out, log=lines.append)
    assert not stale.exists() and out.is_dir()
    assert any("interrupted earlier run" in line for line in lines)


def test_an_internal_error_is_one_line_naming_where(tmp_path, capsys, monkeypatch):
    src, out = _write_tiny(tmp_path / "in", "BERT"), tmp_path / "out"
    monkeypatch.setattr(cli, "verify_written", lambda *a: 1 / 0)
    assert cli.main([str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "ZeroDivisionError" in err and "cli.py" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


@pytest.mark.parametrize("family", ["ViT", "CLIP vision", "Whisper"])
def test_image_and_audio_models_round_trip(tmp_path, family):
    src, out = _write_tiny(tmp_path / "in", family), tmp_path / "out"
    assert cli.main([str(src), str(out), "--fold-value"]) == 0
    assert (out / "keybias_surgery.json").is_file()


def test_tiny_bert_directory_round_trips_with_dtype(tmp_path):
    src = _write_tiny(tmp_path / "in", "BERT")
    out = tmp_path / "out"
    assert cli.main([str(src), str(out), "--fold-value", "--allow-dropout", "--dtype", "float64"]) == 0
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(out), local_files_only=True, use_safetensors=True)
    assert model.dtype == torch.float64
    assert (out / "keybias_surgery.json").is_file()


def test_module_entry_point_prints_usage():
    done = subprocess.run([sys.executable, "-m", "keybias.surgery", "--help"], capture_output=True, text=True,
                          check=True)
    assert "IN_DIR" in done.stdout.upper() and "--fold-value" in done.stdout and "--dtype" in done.stdout


def _save(directory: Path, tensors: dict, like: Path) -> Path:
    import shutil

    from safetensors.torch import save_file

    shutil.copytree(like, directory)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


@pytest.mark.parametrize("case", ["mixed_dtypes", "integer_bias", "nan_weight"])
def test_a_checkpoint_the_output_would_silently_change_is_refused(tmp_path, case, capsys):
    from safetensors.torch import load_file

    plain = _write_tiny(tmp_path / "plain", "BERT")
    tensors = load_file(str(plain / "model.safetensors"))
    key = next(k for k in tensors if k.endswith("attention.self.key.bias"))
    if case == "mixed_dtypes":
        tensors[key.replace("key.bias", "query.weight")] = tensors[key.replace("key.bias", "query.weight")].half()
    elif case == "integer_bias":
        tensors[key] = torch.zeros_like(tensors[key], dtype=torch.int32)
    else:
        tensors[key][0] = float("nan")
    src, out = _save(tmp_path / "in", tensors, plain), tmp_path / "out"
    capsys.readouterr()
    assert cli.main([str(src), str(out), "--fold-value", "--allow-dropout"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert ("NaN or infinite" if case == "nan_weight" else "--dtype") in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["in", "plain"]
    if case != "nan_weight":  # --dtype says which dtype the output holds, so the run goes ahead
        assert cli.main([str(src), str(out), "--dtype", "float32"]) == 0


def test_an_interrupt_a_library_swallowed_still_writes_nothing(tmp_path, capsys, monkeypatch):
    src, out = _write_tiny(tmp_path / "in", "BERT"), tmp_path / "out"
    real = cli.verify_written

    def swallowed(*args):  # a Ctrl-C that a __del__ caught: recorded, never raised here
        cli.INTERRUPTED.set()
        return real(*args)

    monkeypatch.setattr(cli, "verify_written", swallowed)
    assert cli.main([str(src), str(out)]) == cli.EXIT_INTERRUPTED
    assert "interrupted; nothing written" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_an_output_another_run_wrote_meanwhile_is_named(tmp_path, capsys, monkeypatch):
    src, out = _write_tiny(tmp_path / "in", "BERT"), tmp_path / "out"
    real = cli.verify_written

    def other_run_finishes_first(folder, state):
        real(folder, state)
        out.mkdir()
        (out / "model.safetensors").write_bytes(b"the other run's")

    monkeypatch.setattr(cli, "verify_written", other_run_finishes_first)
    assert cli.main([str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert "appeared while this run worked" in err and "internal" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]


def test_an_abbreviated_flag_is_a_usage_error_not_the_flag_it_abbreviates(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main([str(tmp_path / "in"), str(tmp_path / "out"), "--fold"])
    assert stop.value.code == 2
    assert "--fold" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# Another process holding OUT_DIR's lock: a child that takes it, then either exits (a dead run:
# left unreaped it is a zombie, whose process id still answers kill(pid, 0)) or waits on stdin.
_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, str(os.getpid()).encode(), 0)
os.mkdir(sys.argv[2] + str(os.getpid()))  # its temporary folder, named as a run names it
print("locked", flush=True)
if sys.argv[3] == "live":
    sys.stdin.readline()
"""


def _holder(out: Path, state: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out.parent / f".{out.name}.keybias-lock"),
                             str(out.parent / f".{out.name}{cli.TEMP_TAG}"), state],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_dead_run_that_is_still_a_zombie_does_not_block_a_rerun(tmp_path, capsys):
    src, out = _write_tiny(tmp_path / "in", "BERT"), tmp_path / "out"
    proc = _holder(out, "dead")
    try:
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # it has exited, and is not reaped
        assert Path(f"/proc/{proc.pid}/status").read_text().count("zombie") == 1
        os.kill(proc.pid, 0)  # its process id still answers, as a live run's would
        assert cli.main([str(src), str(out)]) == 0
        assert (out / "keybias_surgery.json").is_file()
        assert "interrupted earlier run" in capsys.readouterr().out
        assert _leftovers(tmp_path) == ["in", "out"]  # its temporary folder and the lock file are gone
    finally:
        proc.wait()


def test_a_live_run_blocks_a_second_run_for_the_same_output(tmp_path, capsys):
    src, out = _write_tiny(tmp_path / "in", "BERT"), tmp_path / "out"
    proc = _holder(out, "live")
    try:
        before = _leftovers(tmp_path)
        capsys.readouterr()
        assert cli.main([str(src), str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"another run (process {proc.pid}) is writing" in err, err
        assert _leftovers(tmp_path) == before and not out.exists()  # the other run's files are left alone
    finally:
        proc.communicate("\n", timeout=60)
    assert cli.main([str(src), str(out)]) == 0  # once it has ended, the rerun goes ahead
    assert _leftovers(tmp_path) == ["in", "out"]


def _dropout_folder(directory: Path, kind: str) -> Path:
    if kind == "timm":
        pytest.importorskip("timm")
        import json

        import timm
        from safetensors.torch import save_file

        args = {"img_size": 32, "patch_size": 8, "depth": 1, "attn_drop_rate": 0.1}
        model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, **args)
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224", "num_classes": 0,
                                                           "model_args": args}))
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
        return directory
    import transformers

    cfg = transformers.OPTConfig(hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
                                 word_embed_proj_dim=32, vocab_size=100, max_position_embeddings=32,
                                 attention_dropout=0.1)
    model = transformers.OPTModel(cfg) if kind == "sharded" else families.build("BERT")
    model.save_pretrained(str(directory), safe_serialization=True, max_shard_size="40KB" if kind == "sharded" else "5GB")
    return directory


@pytest.mark.parametrize("kind, where", [("single", "config.json attention_probs_dropout_prob=0.1"),
                                         ("sharded", "config.json attention_dropout=0.1"),
                                         ("timm", "config.json model_args.attn_drop_rate=0.1")])
def test_attention_dropout_in_the_config_is_refused_before_the_model_is_built(tmp_path, capsys, monkeypatch,
                                                                              kind, where):
    src, out = _dropout_folder(tmp_path / "in", kind), tmp_path / "out"

    def never(*_args, **_kwargs):
        raise AssertionError("the model was built although the config shows the refusal")
    for name in ("_architecture", "load_exactly", "load_library_folder"):
        monkeypatch.setattr(cli, name, never)
    capsys.readouterr()
    assert cli.main([str(src), str(out), "--fold-value"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "attention dropout is configured" in err and where in err, err
    assert _leftovers(tmp_path) == ["in"]


def test_a_dropout_that_is_not_on_the_attention_weights_is_not_refused(tmp_path):
    # the control: ViT's hidden dropout (after the attention) leaves the fold exact in any mode
    import transformers

    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                 image_size=16, patch_size=8, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.0)
    transformers.ViTModel(cfg).save_pretrained(str(tmp_path / "in"), safe_serialization=True)
    assert cli.configured_dropout(tmp_path / "in", "hf") is None
    assert cli.main([str(tmp_path / "in"), str(tmp_path / "out"), "--fold-value"]) == 0


def test_help_says_what_the_sharded_mode_scans_for_nan(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert info.value.code == 0
    assert "scanned for NaN only in the attention modules the tool would change" in text
    assert "open_clip" in text and "timm" in text  # every folder format the command takes is named


@pytest.mark.parametrize("sharded", [False, True])
def test_each_safetensors_header_is_read_once_for_the_dtype_refusals(tmp_path, capsys, monkeypatch, sharded):
    """check_input reads every header; the dtype refusals (a single file that mixes dtypes, a
    sharded checkpoint that mixes float dtypes) use those tables and read no header again."""
    import transformers
    from safetensors.torch import load_file, save_file

    cfg = transformers.OPTConfig(hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
                                 word_embed_proj_dim=32, vocab_size=100, max_position_embeddings=32)
    src = tmp_path / "in"
    transformers.OPTModel(cfg).save_pretrained(str(src), safe_serialization=True,
                                               max_shard_size="40KB" if sharded else "5GB")
    files = sorted(src.glob("*.safetensors"))
    path = next(f for f in files if any(n.endswith("q_proj.weight") for n in load_file(str(f))))
    tensors = load_file(str(path))
    name = sorted(n for n in tensors if n.endswith("q_proj.weight"))[0]
    tensors[name] = tensors[name].half()
    save_file(tensors, str(path), metadata={"format": "pt"})
    opened: list[str] = []
    real_open = Path.open

    def counting(self, *args, **kwargs):
        if self.suffix == ".safetensors":
            opened.append(self.name)
        return real_open(self, *args, **kwargs)
    monkeypatch.setattr(Path, "open", counting)
    capsys.readouterr()
    assert cli.main([str(src), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert ("must hold one float dtype" if sharded else "would change their dtype") in err and name in err, err
    assert sorted(opened) == [f.name for f in files]  # each file once, by check_input
