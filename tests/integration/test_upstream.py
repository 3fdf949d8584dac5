"""upstream/: the fix for torch's F.multi_head_attention_forward, checked as `make upstream` runs it."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "upstream"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def patched_mha():
    return _load("patched_mha", UPSTREAM / "patched_mha.py")


def test_make_upstream_stock_fails_patched_passes():
    """`make upstream`: one line per run, stock FAIL, patched PASS on the same cases, exit 0."""
    proc = subprocess.run([sys.executable, str(UPSTREAM / "check.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, proc.stdout
    stock = re.match(r"stock: FAIL (\d+) of (\d+) cases ", lines[0])
    patched = re.match(r"patched: PASS (\d+) of (\d+) cases ", lines[1])
    assert stock and patched, proc.stdout
    n, m = int(stock.group(1)), int(stock.group(2))
    assert 0 < n <= m and patched.group(1) == patched.group(2) == str(m)
    # Every appended-slot option and static_k fails on the stock function; the control does not.
    for option in ("add_bias_kv", "add_zero_attn", "both", "static_k"):
        assert f"need_weights[{option}]" in lines[0]
    assert "[none" not in lines[0]


def test_patch_applies_exactly_and_only_exactly(patched_mha):
    installed = Path(torch.nn.functional.__file__).read_text(encoding="utf-8")
    diff = patched_mha.PATCH.read_text(encoding="utf-8")
    assert diff.startswith("--- a/torch/nn/functional.py\n+++ b/torch/nn/functional.py\n")
    patched = patched_mha.apply_unified_diff(installed, diff)
    assert "appends_key_slots = bias_k is not None or add_zero_attn" in patched
    assert "        src_len = static_k.size(1)\n" in patched
    # Everything outside the hunks is untouched: removing the added lines and restoring the
    # removed ones gives the installed file back.
    assert patched_mha.apply_unified_diff(patched, _reverse(diff)) == installed
    # A context line that no longer matches is refused, not fuzzed.
    broken = diff.replace("\n     # prep attention mask\n", "\n     # prep the attention mask\n", 1)
    assert broken != diff
    with pytest.raises(patched_mha.PatchDoesNotApply):
        patched_mha.apply_unified_diff(installed, broken)


def _reverse(diff):
    out = []
    for line in diff.splitlines(keepends=True):
        m = re.match(r"^@@ -(\d+(?:,\d+)?) \+(\d+(?:,\d+)?) @@(.*)", line, re.S)
        if m:
            out.append(f"@@ -{m.group(2)} +{m.group(1)} @@{m.group(3)}")
        elif line.startswith(("---", "+++")):
            out.append(line)
        elif line.startswith("+"):
            out.append("-" + line[1:])
        elif line.startswith("-"):
            out.append("+" + line[1:])
        else:
            out.append(line)
    return "".join(out)


def test_applied_swaps_and_restores(patched_mha):
    stock = torch.nn.functional.multi_head_attention_forward
    with patched_mha.applied() as fn:
        assert torch.nn.functional.multi_head_attention_forward is fn is not stock
    assert torch.nn.functional.multi_head_attention_forward is stock


def test_paper_reproducer_agrees_with_the_patch(patched_mha):
    """scripts/is_causal_need_weights_quirk.py shows the quirk on stock torch and none patched."""
    quirk = _load("is_causal_need_weights_quirk", ROOT / "scripts" / "is_causal_need_weights_quirk.py")
    stock = {r["option"]: r for r in quirk.report()}
    with patched_mha.applied():
        fixed = {r["option"]: r for r in quirk.report()}
    for option in ("add_bias_kv", "add_zero_attn"):
        assert stock[option]["max_abs_diff_need_weights"] > 1e-3
        assert fixed[option]["max_abs_diff_need_weights"] < 1e-12
        assert fixed[option]["max_abs_diff_false_vs_reference"] < 1e-12
    assert fixed["plain"]["max_abs_diff_need_weights"] < 1e-12


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_patched_function_compiles_under_torchscript(patched_mha):
    """nn.MultiheadAttention scripted within applied() compiles the patched function."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, add_bias_kv=True, dtype=torch.float64).eval()
    x = torch.randn(4, 2, 8, dtype=torch.float64)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64)
    with patched_mha.applied(), torch.no_grad():
        scripted = torch.jit.script(mha)
        fast = scripted(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)[0]
        slow = mha(x, x, x, attn_mask=mask, is_causal=True, need_weights=True)[0]
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-12)
