"""The bitwise-stability measurement: its workload gives the same bits in a fresh process, and a
differing output is named."""

import json
import os
import subprocess
import sys

from keybias.studies import bitwise


def test_workload_gives_the_same_bits_in_another_process():
    """A second interpreter, with another hash seed, must hash every output alike: a digest that
    depends on the process (hash randomisation, uninitialised memory, an unseeded generator) would
    read as a difference between machines."""
    first = bitwise.workload()
    assert {"torch_randn", "matmul_float32", "mha_grad_key_bias_bfloat16", "sweep_delta_E8"} <= set(first)
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", "import json; from keybias.studies import bitwise; "
                          "print(json.dumps(bitwise.workload()))"], env=env, capture_output=True, text=True, check=True)
    other = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(other) == sorted(first)
    differ = [k for k in first if first[k] != other[k]]
    assert not differ, f"outputs that differ between two processes on one machine: {differ}"


def test_measure_names_outputs_that_differ_between_machines(monkeypatch):
    def fake_run_one(env, threads, repeats):
        digests = {"a": "1", "b": "2"}
        if env.get("ATEN_CPU_CAPABILITY") == "default" and "MKL_CBWR" not in env:
            digests["b"] = "3"
        return {"digests": digests, "seconds": 1.0, "capability": env.get("ATEN_CPU_CAPABILITY", "AVX512")}

    monkeypatch.setattr(bitwise, "run_one", fake_run_one)
    result = bitwise.measure(threads=2)
    assert result["pin_sets"]["none"]["differ_by_pair"] == {"avx512_vs_avx2": [], "avx2_vs_default": ["b"]}
    assert result["pin_sets"]["mkl_cbwr"]["differ_by_pair"]["avx2_vs_default"] == []
    assert result["differ_between_1_and_declared_threads"] == []
