"""The wheel, installed as a user would: into a fresh venv, with the core dependencies only.

Run by `make install-check` (and by `.ci/run`), not by `make test`: building a venv and
installing torch into it takes about a minute. The versions come from requirements.lock
(as constraints), so the venv holds the same torch the results were made with.
"""

import json
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.install


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900, **kw)


@pytest.fixture(scope="module")
def user_venv(tmp_path_factory):
    """A fresh venv with the keybias wheel and its core dependencies (torch, safetensors)."""
    tmp = tmp_path_factory.mktemp("install")
    dist = tmp / "dist"
    t0 = time.perf_counter()
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "--disable-pip-version-check", "-w", dist, ROOT])
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = next(dist.glob("keybias-*.whl"))
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    installed = run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                     "-c", ROOT / "requirements.lock", wheel])
    assert installed.returncode == 0, installed.stdout + installed.stderr
    timing = {"wheel_bytes": wheel.stat().st_size, "install_seconds": round(time.perf_counter() - t0, 1)}
    print(f"\nwheel {wheel.name}: {timing['wheel_bytes']:,} bytes; built and installed in "
          f"{timing['install_seconds']} s")
    return {"python": py, "bin": env_dir / "bin", "tmp": tmp, "wheel": wheel}


def test_core_install_holds_the_library_and_not_the_study(user_venv):
    code = ("import importlib.util as u, json; "
            "from keybias import strip_key_bias, fold_value_bias; "
            "print(json.dumps({m: u.find_spec(m) is not None for m in "
            "('torch', 'safetensors', 'transformers', 'pandas', 'papermill', 'matplotlib')}))")
    out = run([user_venv["python"], "-c", code])
    assert out.returncode == 0, out.stderr
    present = json.loads(out.stdout)
    assert present == {"torch": True, "safetensors": True, "transformers": False, "pandas": False,
                       "papermill": False, "matplotlib": False}


def test_the_library_works_without_the_study(user_venv):
    code = """
import torch
from keybias import strip_key_bias, fold_value_bias
torch.manual_seed(0)
mha = torch.nn.MultiheadAttention(16, 2, batch_first=True).double()
with torch.no_grad():
    mha.in_proj_bias.normal_()
x = torch.randn(2, 5, 16, dtype=torch.float64)
before = mha(x, x, x)[0]
assert strip_key_bias(mha, storage="zeros")["parameters_removed"]
after = mha(x, x, x)[0]
print(float((after - before).abs().max()))
"""
    out = run([user_venv["python"], "-c", code])
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.split()[-1]) < 1e-12


def test_console_script_help(user_venv):
    out = run([user_venv["bin"] / "keybias-surgery", "--help"])
    assert out.returncode == 0, out.stderr
    assert "usage: keybias-surgery" in out.stdout and "--fold-value" in out.stdout


def tiny_bert(folder: Path) -> Path:
    """A tiny random BERT saved with safetensors, made by this (the project's) venv."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16)
    model = BertModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_()
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def test_missing_extra_is_named(user_venv):
    model = tiny_bert(user_venv["tmp"] / "bert-core")
    out = run([user_venv["bin"] / "keybias-surgery", model, user_venv["tmp"] / "out-core"])
    assert out.returncode == 2
    assert out.stderr.strip().startswith("error:") and "keybias[hf]" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (user_venv["tmp"] / "out-core").exists()


def test_strip_and_fold_with_the_hf_extra(user_venv):
    added = run([user_venv["python"], "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                 "-c", ROOT / "requirements.lock", f"{user_venv['wheel']}[hf]"])
    assert added.returncode == 0, added.stdout + added.stderr
    model = tiny_bert(user_venv["tmp"] / "bert-hf")
    out_dir = user_venv["tmp"] / "bert-stripped"
    out = run([user_venv["bin"] / "keybias-surgery", model, out_dir, "--fold-value", "--allow-dropout"],
              env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    print(out.stdout + out.stderr)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (out_dir / "model.safetensors").is_file() and (out_dir / "config.json").is_file()
    assert "whole model" in out.stdout and ": ok" in out.stdout
