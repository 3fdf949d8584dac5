"""The bitwise-stability measurement: its workload is deterministic, and a differing output is named."""

from keybias.studies import bitwise


def test_workload_is_deterministic_in_one_process():
    first = bitwise.workload()
    assert first == bitwise.workload()
    assert {"torch_randn", "matmul_float32", "mha_grad_key_bias_bfloat16", "sweep_delta_E8"} <= set(first)


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
