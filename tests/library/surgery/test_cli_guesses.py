"""The command line never writes a guess: a checkpoint that does not match its config, a
dangling OUT_DIR and an interrupt after the output is complete, each with its exit code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from keybias.studies.fixtures import families
from keybias.surgery import cli


def _tiny(directory: Path) -> Path:
    families.build("BERT").float().save_pretrained(str(directory), safe_serialization=True)
    return directory


def _edit(directory: Path, edit) -> None:
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _key(tensors: dict, part: str) -> str:
    return sorted(n for n in tensors if part in n)[0]


def _missing(t):
    del t[_key(t, "attention.self.key.bias")]


def _unexpected(t):
    t["extra.projection.weight"] = torch.ones(3, 2)


def _mismatch(t):
    t[_key(t, "attention.self.query.weight")] = torch.zeros(4, 4)


CASES = {  # edit -> words the one-line error must contain
    "missing": (_missing, ["missing from the checkpoint", "attention.self.key.bias"]),
    "unexpected": (_unexpected, ["unexpected tensor", "extra.projection.weight"]),
    "mismatch": (_mismatch, ["shape mismatch", "attention.self.query.weight", "(4, 4)"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_checkpoint_that_does_not_match_its_config_exits_2_naming_it(tmp_path, case, capsys):
    src, out = _tiny(tmp_path / "in"), tmp_path / "out"
    edit, words = CASES[case]
    _edit(src, edit)
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    code = cli.main([str(src), str(out)])
    captured = capsys.readouterr()
    assert code == 2
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:"), captured.err
    for word in words:
        assert word in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before and not out.exists()


def test_the_matching_checkpoint_passes_the_same_check(tmp_path):
    # the control of the cases above: an untouched checkpoint is accepted and written
    src, out = _tiny(tmp_path / "in"), tmp_path / "out"
    _edit(src, lambda t: None)
    assert cli.main([str(src), str(out)]) == 0
    assert (out / "keybias_surgery.json").is_file()


def test_dangling_output_symlink_is_a_user_error(tmp_path, capsys):
    src, out = _tiny(tmp_path / "in"), tmp_path / "out"
    out.symlink_to(tmp_path / "nowhere")
    capsys.readouterr()
    assert cli.main([str(src), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "dangling symbolic link" in err and "please report" not in err
    assert out.is_symlink() and not (tmp_path / "nowhere").exists()


def test_interrupt_after_the_output_is_complete_exits_0(tmp_path, monkeypatch, capsys):
    src, out = _tiny(tmp_path / "in"), tmp_path / "out"

    def log(message: str) -> None:
        if message.startswith("wrote"):
            raise KeyboardInterrupt  # Ctrl-C just as "wrote" is printed
    monkeypatch.setattr(cli, "_log", log)
    assert cli.main([str(src), str(out)]) == 0
    assert (out / "keybias_surgery.json").is_file()


def test_interrupt_before_the_output_is_complete_exits_130_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    src, out = _tiny(tmp_path / "in"), tmp_path / "out"

    def stop(*_args):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "verify_written", stop)
    assert cli.main([str(src), str(out)]) == cli.EXIT_INTERRUPTED
    assert "interrupted; nothing written" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_interrupt_beside_an_earlier_complete_output_is_not_a_success(tmp_path, monkeypatch, capsys):
    """OUT_DIR holds an earlier run's complete output; this run is interrupted before it checks
    its arguments: it wrote nothing, so it must not exit 0."""
    src, out = _tiny(tmp_path / "in"), tmp_path / "out"
    assert cli.main([str(src), str(out)]) == 0
    before = sorted(os.listdir(out))

    def stop(*_args, **_kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "check_input", stop)
    assert cli.main([str(src), str(out)]) == cli.EXIT_INTERRUPTED
    assert "interrupted; nothing written" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == before


def test_read_back_check_catches_a_tensor_that_differs(tmp_path):
    folder = _tiny(tmp_path / "in")
    state = load_file(str(folder / "model.safetensors"))
    cli.verify_written(folder, state)  # the file as written passes
    name = _key(state, "attention.self.key.bias")
    changed = dict(state, **{name: state[name] + 1})
    with pytest.raises(cli.CliError, match="gave a different"):
        cli.verify_written(folder, changed)


@pytest.mark.parametrize("argv", [["--dtype", "int8"], [], ["only-one"], ["a", "b", "--no-such-flag"]])
def test_usage_errors_are_one_line_exit_2(argv, capsys, tmp_path):
    with pytest.raises(SystemExit) as info:
        cli.main([str(tmp_path / a) if not a.startswith("-") and a != "int8" else a for a in argv])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: ")


# A real process: the command line run as `python -m keybias.surgery` would, with hooks that stop
# at a known point and wait on stdin, so that the test's Ctrl-C lands exactly there.
_AFTER_MAIN = """
import sys
from keybias.surgery import cli
code = cli.main()
print("main returned", flush=True)
sys.stdin.readline()  # the interpreter's teardown after the output is complete, made as long as the test needs
sys.exit(code)
"""
_BEFORE_COMMIT = """
import sys
from keybias.surgery import cli
real = cli.verify_written
def held(*args):
    real(*args)
    print("verified", flush=True)
    sys.stdin.readline()  # the output is written to its temporary folder, not yet in place
cli.verify_written = held
sys.exit(cli.main())
"""


def _interrupted_process(script: str, marker: str, src: Path, out: Path, signum=None) -> tuple[int, str]:
    import signal
    import subprocess
    import sys

    signum = signal.SIGINT if signum is None else signum

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(cli.__file__).parents[2]),
                                                                    os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-c", script, str(src), str(out)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for line in proc.stdout:
            if line.startswith(marker):
                break
        else:
            raise AssertionError(f"the run ended before {marker!r}: {proc.wait()} {proc.stderr.read()}")
        proc.send_signal(signum)
        _, err = proc.communicate("\n", timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def test_a_process_interrupted_after_its_output_is_complete_exits_0(tmp_path):
    src, out = _tiny(tmp_path / "in"), tmp_path / "out"
    code, err = _interrupted_process(_AFTER_MAIN, "main returned", src, out)
    assert code == 0, err
    assert (out / "keybias_surgery.json").is_file()


def test_a_process_interrupted_before_its_output_is_in_place_exits_130_and_leaves_nothing(tmp_path):
    # the control of the test above: the same Ctrl-C one step earlier is not ignored
    src, out = _tiny(tmp_path / "in"), tmp_path / "out"
    code, err = _interrupted_process(_BEFORE_COMMIT, "verified", src, out)
    assert code == cli.EXIT_INTERRUPTED and "interrupted; nothing written" in err, err
    assert sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_a_process_stopped_by_kill_or_a_closed_terminal_leaves_nothing(tmp_path, name):
    """kill, timeout and job schedulers send SIGTERM, a closed terminal SIGHUP: the run stops as on
    Ctrl-C, removes its temporary folder and lock, and exits 128 + the signal's number."""
    import signal

    signum = getattr(signal, name)
    src, out = _tiny(tmp_path / "in"), tmp_path / "out"
    code, err = _interrupted_process(_BEFORE_COMMIT, "verified", src, out, signum)
    assert code == 128 + signum and f"stopped by {name}; nothing written" in err, err
    assert sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.parametrize("sharded", [False, True])
def test_a_config_transformers_warns_about_prints_only_the_tools_line(tmp_path, capfd, sharded):
    """A pad_token_id outside the vocabulary: transformers warns about it as it reads the config,
    then torch refuses the embedding; the user sees one line, the tool's, and no 'please report'."""
    import json

    import transformers

    cfg = transformers.OPTConfig(hidden_size=32, num_hidden_layers=1, ffn_dim=64, num_attention_heads=4,
                                 word_embed_proj_dim=32, vocab_size=100, max_position_embeddings=32)
    cfg.architectures = ["OPTForCausalLM"]
    src = tmp_path / "in"
    transformers.OPTForCausalLM(cfg).save_pretrained(str(src), safe_serialization=True,
                                                     max_shard_size="40KB" if sharded else "5GB")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(dict(config, pad_token_id=500)))
    capfd.readouterr()
    assert cli.main([str(src), str(tmp_path / "out")]) == 2
    err = capfd.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error:"), err
    assert "Padding_idx" in err and "internal" not in err and "pad_token_id must be" not in err
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_quiet_libraries_silences_their_warnings_and_gives_them_back(caplog):
    import logging
    import warnings

    timm_log, hf_log = logging.getLogger("timm.models._builder"), logging.getLogger("transformers.configuration_utils")
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with cli.quiet_libraries():
            timm_log.warning("timm's warning")
            hf_log.warning("transformers' warning")
            warnings.warn("a Python warning", UserWarning, stacklevel=1)
        assert caplog.records == [] and seen == []
        # the control: after it, the same warnings come through
        timm_log.warning("timm's warning")
        warnings.warn("a Python warning", UserWarning, stacklevel=1)
        assert [r.getMessage() for r in caplog.records] == ["timm's warning"] and len(seen) == 1


def test_an_interrupt_while_the_arguments_are_parsed_exits_130(tmp_path, monkeypatch, capsys):
    def stop(*_args, **_kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli._Parser, "parse_args", stop)
    assert cli.main([str(tmp_path / "in"), str(tmp_path / "out")]) == cli.EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip() == "error: interrupted; nothing written"
    assert os.listdir(tmp_path) == []


def test_a_missing_input_is_named_before_an_output_that_exists(tmp_path, capsys):
    """Both arguments are wrong: the error names the input, the one a user mistyped, not the output."""
    out = tmp_path / "out"
    out.mkdir()
    assert cli.main([str(tmp_path / "no-such-model"), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: input directory") and "does not exist" in err, err
    # the control: with the input present, the same output is refused as existing
    assert cli.main([str(_tiny(tmp_path / "in")), str(out)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_a_ctrl_c_that_a_library_wraps_in_its_own_error_is_an_interrupt(tmp_path, monkeypatch, capsys):
    """transformers' lazy import turns a KeyboardInterrupt into a ModuleNotFoundError, and a library
    may replace the SIGINT handler: the run is still interrupted (130), not an internal error."""
    src, out = _tiny(tmp_path / "in"), tmp_path / "out"

    def wrapped(*_args):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise ModuleNotFoundError("Could not import module 'BertModel'") from exc

    monkeypatch.setattr(cli, "verify_written", wrapped)
    assert cli.main([str(src), str(out)]) == cli.EXIT_INTERRUPTED
    err = capsys.readouterr().err.strip()
    assert err == "error: interrupted; nothing written" and "internal" not in err
    assert sorted(os.listdir(tmp_path)) == ["in"]
    # the control: the same error with no interrupt under it is the tool's fault, exit 2
    monkeypatch.setattr(cli, "verify_written", lambda *_a: (_ for _ in ()).throw(ModuleNotFoundError("x")))
    assert cli.main([str(src), str(out)]) == 2 and "internal ModuleNotFoundError" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["output is the input", "parent is a file"])
def test_an_output_that_cannot_be_one_is_named_for_what_it_is(tmp_path, case, capsys):
    src = _tiny(tmp_path / "in")
    if case == "output is the input":
        out, said = src, "is the input directory"
    else:
        (tmp_path / "a-file").write_text("")
        out, said = tmp_path / "a-file" / "out", "is not a directory"
    assert cli.main([str(src), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err, err
    assert sorted(os.listdir(tmp_path)) == sorted(["in", *(["a-file"] if case == "parent is a file" else [])])
