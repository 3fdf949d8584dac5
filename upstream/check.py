#!/usr/bin/env python3
"""`make upstream`: run test_mha_causal_slots.py on the stock and on the patched function.

Prints one line per run,

    stock: FAIL <n> of <m> cases ...
    patched: PASS <m> of <m> cases ...

and exits 0 only if the stock function fails at least one case and the patched one passes all
of the same cases. `--verbose` adds the unittest report of each run after its line.

The test module imports torch.testing._internal.common_utils, which imports the `expecttest`
package (a PyTorch test dependency, not in this project's lock). When it is missing, a stub
that provides expecttest.TestCase as a plain unittest.TestCase is put in its place; the test
uses none of expecttest's methods.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import re
import sys
import types
import unittest
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEST_FILE = HERE / "test_mha_causal_slots.py"


def _ensure_expecttest() -> bool:
    """Stub `expecttest` if it is not installed; True if the stub was used."""
    try:
        import expecttest  # noqa: F401
        return False
    except ImportError:
        stub = types.ModuleType("expecttest")

        class TestCase(unittest.TestCase):
            pass

        stub.TestCase = TestCase
        sys.modules["expecttest"] = stub
        return True


def _load_tests():
    spec = importlib.util.spec_from_file_location("test_mha_causal_slots", TEST_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return unittest.defaultTestLoader.loadTestsFromModule(module)


def _short(test: unittest.TestCase) -> str:
    """test_is_causal_matches_explicit_reference_key_padding_mask_True_need_weights_False_option_both
    -> reference[both, need_weights=False, key_padding_mask]"""
    name = test.id().rsplit(".", 1)[-1]
    kind = "reference" if "matches_explicit_reference" in name else "need_weights"
    option = re.search(r"_option_(\w+?)(?:_need_weights_|_key_padding_mask_|$)", name)
    if not option:
        return name
    parts = [option.group(1)]
    flag = re.search(r"_need_weights_(True|False)", name)
    if flag:
        parts.append(f"need_weights={flag.group(1)}")
    if "_key_padding_mask_True" in name:
        parts.append("key_padding_mask")
    return f"{kind}[{', '.join(parts)}]"


def run_once(patched: bool):
    """Run the whole test module once; returns (result, report text)."""
    import patched_mha

    suite = _load_tests()
    stream = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner = unittest.TextTestRunner(stream=stream, verbosity=2)
        if patched:
            with patched_mha.applied():
                result = runner.run(suite)
        else:
            result = runner.run(suite)
    return result, stream.getvalue()


def line(label: str, result: unittest.TestResult, detail: str) -> str:
    m = result.testsRun
    bad = [t for t, _ in result.failures] + [t for t, _ in result.errors]
    if bad:
        names = ", ".join(sorted(_short(t) for t in bad))
        return (f"{label}: FAIL {len(bad)} of {m} cases ({detail}; {len(result.failures)} wrong "
                f"outputs, {len(result.errors)} raised): {names}")
    return f"{label}: PASS {m} of {m} cases ({detail})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="print each run's unittest report")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    stubbed = _ensure_expecttest()
    import torch

    where = f"torch {torch.__version__}" + (", expecttest stubbed" if stubbed else "")
    stock, stock_report = run_once(patched=False)
    print(line("stock", stock, f"{where}, stock F.multi_head_attention_forward"), flush=True)
    if args.verbose:
        print(stock_report)
    fixed, fixed_report = run_once(patched=True)
    print(line("patched", fixed, f"{where}, with upstream/mha_causal_slots.patch"), flush=True)
    if args.verbose:
        print(fixed_report)
    stock_fails = bool(stock.failures or stock.errors)
    fixed_passes = fixed.wasSuccessful() and fixed.testsRun == stock.testsRun > 0
    return 0 if stock_fails and fixed_passes else 1


if __name__ == "__main__":
    sys.exit(main())
