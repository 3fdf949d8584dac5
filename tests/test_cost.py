"""keybias.cost: memory counts against real modules, the no-b_k implementation, the timing statistics."""

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from keybias import cost
from keybias.params import load_profile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- memory


@pytest.mark.parametrize("embed_dim,heads", [(8, 2), (64, 1), (768, 12), (1600, 25)])
def test_mha_counts_match_real_module(embed_dim, heads):
    mha = nn.MultiheadAttention(embed_dim, heads, bias=True, device="meta")
    assert sum(p.numel() for p in mha.parameters()) == cost.mha_param_count(embed_dim)
    assert mha.in_proj_bias[embed_dim : 2 * embed_dim].numel() == embed_dim
    row = cost.per_layer_memory([embed_dim], heads).iloc[0]
    assert row["match"] and row["bk_params_module"] == embed_dim


def test_bias_free_count_differs_by_all_four_biases():
    mha = nn.MultiheadAttention(64, 4, bias=False, device="meta")
    n = sum(p.numel() for p in mha.parameters())
    assert n == cost.mha_param_count(64, bias=False)
    assert n != cost.mha_param_count(64, bias=True)  # a wrong formula is caught
    assert cost.mha_param_count(64) - n == 4 * 64


def test_encoder_layer_formula_against_torch_layer():
    layer = nn.TransformerEncoderLayer(96, 4, 384, device="meta")
    assert sum(p.numel() for p in layer.parameters()) == cost.encoder_layer_param_count(96, 384)
    assert sum(p.numel() for p in layer.parameters()) != cost.encoder_layer_param_count(96, 385)


def test_architectures_against_torch_modules():
    table = cost.check_architectures(using="torch")
    assert table["match"].all(), table


def test_architectures_against_transformers_models():
    pytest.importorskip("transformers")
    table = cost.check_architectures(["BERT-base", "ViT-B/16", "GPT-2 small"], using="transformers")
    assert table["match"].all(), table
    # published sizes of these models
    assert table.set_index("architecture")["model_params_module"].to_dict() == {
        "BERT-base": 109_482_240, "ViT-B/16": 86_389_248, "GPT-2 small": 124_439_808}


def test_memory_table_fractions_and_optimizer_state():
    t = cost.memory_table().set_index("architecture")
    xl = t.loc["GPT-2 XL"]
    assert xl.bk_params == 48 * 1600
    assert xl.bk_adam_state == 2 * xl.bk_params and xl.bk_sgd_momentum_state == xl.bk_params
    assert xl.bk_training_adam_bytes == 4 * 4 * xl.bk_params
    assert math.isclose(xl.bk_fraction_of_attention_layer, 1 / (4 * 1600 + 4))
    assert (t.bk_fraction_of_model < t.bk_fraction_of_attention_layer).all()
    with pytest.raises(ValueError, match="architecture"):
        cost.architecture_params("GPT-5")


# ----------------------------------------------------------------------------- implementations


def _inputs(e=32, b=3, n=5, s=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n, e, generator=g, dtype=torch.float64)
    kv = torch.randn(b, s, e, generator=g, dtype=torch.float64)
    up = torch.randn(b, n, e, generator=g, dtype=torch.float64)
    return q, kv, up


def _run(params, q, kv, up, heads):
    for p in params.values():
        p.grad = None
    y = cost.explicit_attention(params, q, kv, kv, heads)
    (y * up).sum().backward()
    return y.detach(), {k: p.grad.clone() for k, p in params.items()}


def _impls(e=32, heads=4):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(e, heads, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_bias.normal_(0, 1.0)
        mha.out_proj.bias.normal_(0, 0.5)
    return mha, cost.explicit_params(mha), cost.explicit_params(mha, key_bias=False)


def test_no_bk_equals_explicit_with_zero_key_bias():
    mha, full, no_bk = _impls()
    assert "b_k" in full and "b_k" not in no_bk
    with torch.no_grad():
        full["b_k"].zero_()
    q, kv, up = _inputs()
    y_a, g_a = _run(full, q, kv, up, 4)
    y_b, g_b = _run(no_bk, q, kv, up, 4)
    torch.testing.assert_close(y_b, y_a, rtol=1e-13, atol=1e-13)
    for k in no_bk:
        torch.testing.assert_close(g_b[k], g_a[k], rtol=1e-12, atol=1e-12)


def test_no_bk_equals_explicit_with_nonzero_key_bias_up_to_rounding():
    mha, full, no_bk = _impls()
    q, kv, up = _inputs()
    y_a, g_a = _run(full, q, kv, up, 4)
    y_b, g_b = _run(no_bk, q, kv, up, 4)
    torch.testing.assert_close(y_b, y_a, rtol=1e-10, atol=1e-10)
    for k in no_bk:
        torch.testing.assert_close(g_b[k], g_a[k], rtol=1e-9, atol=1e-9)
    assert g_a["b_k"].abs().max() < 1e-9  # the removed parameter had no gradient to give


def test_removing_query_bias_instead_changes_the_function():
    mha, full, _ = _impls()
    q, kv, up = _inputs()
    no_bq = {k: v for k, v in cost.explicit_params(mha).items() if k != "b_q"}
    y_a, _ = _run(full, q, kv, up, 4)
    y_c, _ = _run(no_bq, q, kv, up, 4)
    assert (y_a - y_c).abs().max() > 1e-3


def test_explicit_implementation_matches_nn_multihead_attention():
    mha, full, _ = _impls()
    q, kv, _ = _inputs()
    ref = mha(q, kv, kv, need_weights=False)[0]
    torch.testing.assert_close(cost.explicit_attention(full, q, kv, kv, 4), ref, rtol=1e-12, atol=1e-12)


def test_build_implementations_share_values_and_reject_bad_heads():
    impls = cost.build_implementations(32, 4, seed=3)
    assert set(impls) == set(cost.IMPLEMENTATIONS)
    x = torch.randn(2, 5, 32)
    outs = {k: f(x, x, x) for k, (_, f, _) in impls.items()}
    torch.testing.assert_close(outs["explicit"], outs["explicit_control"], rtol=0, atol=0)
    torch.testing.assert_close(outs["explicit_no_bk"], outs["explicit"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(outs["explicit"], outs["mha"], rtol=1e-4, atol=1e-5)
    assert (outs["explicit_no_bias"] - outs["explicit"]).abs().max() > 1e-3
    n_bk = sum(p.numel() for p in impls["explicit"][0]) - sum(p.numel() for p in impls["explicit_no_bk"][0])
    assert n_bk == 32
    with pytest.raises(ValueError, match="divisible"):
        cost.build_implementations(30, 4)


# ----------------------------------------------------------------------------- statistics and timing


def test_bootstrap_ratio_contains_one_for_identical_and_excludes_for_half():
    rng = np.random.default_rng(0)
    a = 1.0 + 0.05 * rng.standard_normal(40)
    r, lo, hi = cost.bootstrap_ratio(a.copy(), a, n_boot=500, seed=1)
    assert r == 1.0 and lo <= 1.0 <= hi
    r, lo, hi = cost.bootstrap_ratio(0.5 * a, a, n_boot=500, seed=1)
    assert math.isclose(r, 0.5) and hi < 1.0
    r, lo, hi = cost.bootstrap_ratio(0.5 * a, a, n_boot=500, seed=1, statistic="ratio_of_medians")
    assert math.isclose(r, 0.5) and hi < 1.0
    b = a * (1 + 0.01 * rng.standard_normal(40))  # paired noise: narrow CI around 1
    r, lo, hi = cost.bootstrap_ratio(b, a, n_boot=500, seed=1)
    assert lo <= 1.0 <= hi and hi - lo < 0.02
    assert cost.bootstrap_ratio(0.9 * a, a, n_boot=500, seed=1) == cost.bootstrap_ratio(0.9 * a, a, n_boot=500, seed=1)
    with pytest.raises(ValueError, match="statistic"):
        cost.bootstrap_ratio(a, a, statistic="mean")
    with pytest.raises(ValueError, match="paired"):
        cost.bootstrap_ratio(a[:10], a, n_boot=100)


def test_binomial_lower_fraction_is_the_tail_quantile():
    stats = pytest.importorskip("scipy.stats")
    for n in (4, 20, 60):
        f = cost.binomial_lower_fraction(n, 0.95, 1e-3)
        k = round(f * n)
        assert stats.binom.cdf(k - 1, n, 0.95) <= 1e-3 < stats.binom.cdf(k, n, 0.95)


def test_time_config_interleaves_every_implementation_and_phase():
    raw = cost.time_config(embed_dim=16, seq_len=4, batch=1, attention="cross", mode="training", head_dim=8,
                           reps=3, warmup=1)
    assert set(raw.implementation) == set(cost.IMPLEMENTATIONS)
    assert set(raw.phase) == set(cost.PHASES["training"])
    assert len(raw) == 3 * len(cost.IMPLEMENTATIONS) * 4
    assert (raw.seconds >= 0).all()
    tot = raw[raw.phase == "total"].set_index(["rep", "implementation"]).seconds
    parts = raw[raw.phase != "total"].groupby(["rep", "implementation"]).seconds.sum()
    np.testing.assert_allclose(tot.sort_index(), parts.sort_index(), rtol=1e-9, atol=1e-12)
    # every repetition runs each implementation once
    assert (raw[raw.phase == "total"].groupby("rep").implementation.nunique() == len(cost.IMPLEMENTATIONS)).all()


@pytest.mark.parametrize("kw,match", [
    ({"attention": "diagonal"}, "attention"), ({"mode": "eval"}, "mode"), ({"optimizer": "lion"}, "optimizer"),
    ({"embed_dim": 0}, "embed_dim"), ({"clock": "sundial"}, "clock"),
])
def test_time_config_rejects_bad_arguments(kw, match):
    args = dict(embed_dim=16, seq_len=4, batch=1, attention="self", mode="inference", reps=2, warmup=1)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        cost.time_config(**args)


def test_run_benchmark_requires_thirty_reps():
    with pytest.raises(ValueError, match="reps"):
        cost.run_benchmark(embed_dims=[16], seq_lens=[4], batch_sizes=[1], base_embed_dim=16, base_seq_len=4,
                           base_batch=1, reps=5)


def test_removed_work_byte_model():
    w = cost.removed_work(128, 64, 8, "adam")
    assert w["forward_bytes"] == 2 * 8 * 64 * 128 * 4
    assert w["backward_bytes"] == 8 * 64 * 128 * 4
    assert w["step_bytes"] == 128 * 4 * 4
    assert cost.removed_work(128, 64, 8, "sgd_momentum")["step_bytes"] == 128 * 3 * 4


def test_sweep_configs_one_axis_at_a_time():
    c = cost.sweep_configs([64, 128], [16, 32], [1], 64, 16, 1)
    assert len(c) == 3  # base shared by all axes
    assert c.set_index(["embed_dim", "seq_len", "batch"]).loc[(64, 16, 1), "axes"] == "embed_dim,seq_len,batch"


def test_device_status_marks_absent_cuda_not_run():
    st = cost.device_status("cpu")
    if not torch.cuda.is_available():
        row = st[st.device == "cuda"].iloc[0]
        assert row.status == "not run" and "no CUDA" in row.reason


# ----------------------------------------------------------------------------- parameters and CLI


@pytest.mark.parametrize("profile", ["smoke", "paper"])
def test_profiles_set_exactly_the_parameters(profile):
    checked = load_profile(profile, ROOT / "params", ["06_cost"])["06_cost"]
    assert set(checked) == set(cost.PARAMETERS)


def test_machine_specific_outputs_cover_timing_csvs():
    import fnmatch

    assert any(fnmatch.fnmatch("data/cost_timing_ratios.csv", p) for p in cost.MACHINE_SPECIFIC_OUTPUTS)
    assert any(fnmatch.fnmatch("data/cost_bench_timing_ratios.csv", p) for p in cost.MACHINE_SPECIFIC_OUTPUTS)
    assert not any(fnmatch.fnmatch("data/cost_memory.csv", p) for p in cost.MACHINE_SPECIFIC_OUTPUTS)


@pytest.mark.parametrize("argv", [[], ["--full", "--quick"], ["--quick", "--device", "tpu"], ["--quick", "--threads", "0"]])
def test_cli_refuses_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cost.main(argv)
    assert exc.value.code == 2


def test_allocator_check_not_run_without_gpu():
    row = cost.allocator_check(256, "sgd_momentum", "cpu")
    assert row["expected_bytes"] == 4 * 256 * 3
    if not torch.cuda.is_available():
        assert row["status"] == "not run" and row["match"] is None
    else:
        assert cost.allocator_check(256, "adam", "cuda")["match"]


# ----------------------------------------------------------------------------- notebook summaries


def test_memory_latex_and_claims_pass_and_fail():
    layer = cost.per_layer_memory(cost.LAYER_WIDTHS)
    memory = cost.memory_table().merge(cost.check_architectures(using="torch")[["architecture", "match"]], on="architecture")
    tex = cost.memory_latex(memory)
    assert tex.startswith(r"\begin{tabular}") and r"\bottomrule" in tex and "GPT-2 XL & 1600 & 48" in tex
    assert "76{,}800" in tex  # GPT-2 XL's b_k with LaTeX thousands
    claims, macros = cost.memory_claims(layer, memory)
    fraction, counts = claims
    assert "0.0325% at E = 768" in fraction[1]  # generated from the data
    assert fraction[2] == pytest.approx(fraction[3]) and counts[2] == 0
    assert macros["CostBertEmbedDim"] == 768 and macros["CostBkParamsGptXL"] == 48 * 1600
    # a count that does not match its module makes the count claim fail
    broken = memory.assign(match=[False] + [True] * (len(memory) - 1))
    assert cost.memory_claims(layer, broken)[0][1][2] == 1
    with pytest.raises(ValueError, match="768"):
        cost.memory_claims(layer[layer["embed_dim"] != 768], memory)


def _synthetic(saving=0.01, predicted_s=0.01, control_width=0.02, n=6, slower=0):
    """ratios (no_bk and control per config) and the byte-model frame, for training totals
    and inference forwards: no_bk ratio 1 - saving with CI +-0.005, control around 1."""
    rows = []
    for i in range(n):
        for mode, phase in (("training", "total"), ("inference", "forward")):
            cfg = dict(device="cpu", attention="self", mode=mode, embed_dim=64 * (i + 1), seq_len=16, batch=1,
                       num_heads=1, phase=phase, numerator_median_s=1.0 - saving, denominator_median_s=1.0)
            s = -0.05 if i < slower else saving
            rows.append({**cfg, "ratio": "no_bk", "value": 1 - s, "ci_low": 1 - s - 0.005, "ci_high": 1 - s + 0.005})
            rows.append({**cfg, "ratio": "control", "value": 1.0, "ci_low": 1 - control_width / 2,
                         "ci_high": 1 + control_width / 2})
            rows.append({**cfg, "ratio": "no_bias_mha", "value": 0.97, "ci_low": 0.96, "ci_high": 0.98})
    ratios = pd.DataFrame(rows)
    ratios["ci_width"] = ratios["ci_high"] - ratios["ci_low"]
    ratios["contains_one"] = (ratios["ci_low"] <= 1) & (ratios["ci_high"] >= 1)
    model = cost.predict_saving(ratios, {"bandwidth_bytes_per_s": 1e30, "small_op_s": predicted_s / 2},
                                {64 * (i + 1): predicted_s / 2 for i in range(n)})
    return ratios, model


def test_timing_claims_saving_against_the_model_alone():
    ratios, model = _synthetic(saving=0.01, predicted_s=0.02)
    claims, macros = cost.timing_claims(ratios, model)
    by_id = {c[0]: c for c in claims}
    value, bound = by_id["cost-training-saving-not-above-model"][2:4]
    assert value == 1.0 and value >= bound
    assert by_id["cost-control-ci-contains-one"][2] == 1.0
    assert macros["CostTrainNotAboveModel"] == 6 and macros["CostSlower"] == 0
    assert macros["CostDistinguishableByChance"] == "0.30"  # (1 - LEVEL) / 2 * 12
    assert macros["CostLevelPercent"] == 95
    # a saving far above what the removed work predicts fails, however wide the control is
    ratios, model = _synthetic(saving=0.10, predicted_s=0.01, control_width=0.5)
    value, bound = {c[0]: c for c in cost.timing_claims(ratios, model)[0]}["cost-training-saving-not-above-model"][2:4]
    assert value == 0.0 and value < bound


def test_timing_claims_count_slower_and_largest_point():
    ratios, model = _synthetic(slower=2)
    _, macros = cost.timing_claims(ratios, model)
    assert macros["CostSlower"] == 4 and macros["CostSlowerTraining"] == 2 and macros["CostSlowerInference"] == 2
    assert macros["CostSlowestHighPercent"] < 0
    assert macros["CostLargestPointSavingPercent"] == pytest.approx(1.0)
    assert "$E=" in macros["CostLargestPointSavingWhere"]
    # no training rows: the training claim is not recorded rather than passing on nothing
    inf = ratios[ratios["mode"] == "inference"]
    claims, _ = cost.timing_claims(inf, model[model["mode"] == "inference"])
    assert [c[0] for c in claims] == ["cost-control-ci-contains-one"]


def test_with_not_run_adds_reasoned_rows_for_absent_devices():
    ratios, model = _synthetic(n=1)
    out = cost.with_not_run(ratios, "cpu", passes=("training",), attentions=("self",))
    assert (out.loc[out["device"] == "cpu", "status"] == "measured").all()
    if not torch.cuda.is_available():
        extra = out[out["device"] == "cuda"]
        assert set(extra["status"]) == {"not run"} and (extra["reason"] != "").all()
        assert len(extra) == len(cost.RATIOS)
        assert set(cost.with_not_run(model, "cpu")["ratio"].dropna()) == {"no_bk"}


def test_time_ratio_figure_draws_every_panel():
    ratios, model = _synthetic(n=2)
    fig = cost.time_ratio_figure(ratios, model, base_embed_dim=64, base_seq_len=16, base_batch=1,
                                 attentions=["self"], passes=["training"], device="cpu", threads=1)
    assert len(fig.axes) == 3 and fig.axes[0].get_xlabel() == "embed_dim"
