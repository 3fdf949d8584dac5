"""keybias.studies.cost*: memory counts against real modules, the block without b_k, the timing
statistics, and the claims of notebook 06 fed doctored data (mutation tests)."""

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from keybias.core.claimspec import list_claims
from keybias.core.recorder import Recorder
from keybias.core.reduce import NonFiniteValues
from keybias.studies import style
from keybias.studies.cost import bench
from keybias.studies.cost import config as cost
from keybias.studies.cost import judge as cost_judge
from keybias.studies.cost import measure as cost_measure
from keybias.studies.cost import memory as cost_memory
from keybias.studies.cost import show as cost_show
from keybias.studies.cost import stats as cost_stats
from keybias.studies.cost import traffic as cost_traffic
from keybias.studies.params import load_profile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[3]


# ----------------------------------------------------------------------------- memory


@pytest.mark.parametrize("embed_dim,heads", [(8, 2), (64, 1), (768, 12), (1600, 25)])
def test_mha_counts_match_real_module(embed_dim, heads):
    mha = nn.MultiheadAttention(embed_dim, heads, bias=True, device="meta")
    assert sum(p.numel() for p in mha.parameters()) == cost_memory.mha_param_count(embed_dim)
    assert mha.in_proj_bias[embed_dim : 2 * embed_dim].numel() == embed_dim
    row = cost_memory.per_layer_memory([embed_dim], heads).iloc[0]
    assert row["match"] and row["bk_params_module"] == embed_dim


def test_bk_share_of_a_layer_is_one_over_four_e_plus_four():
    """Was the claim cost-bk-attention-layer-fraction-e768: true by construction, so a unit test."""
    layer = cost_memory.per_layer_memory(cost_memory.LAYER_WIDTHS)
    np.testing.assert_allclose(layer["bk_fraction_of_layer"], 1 / (4 * layer["embed_dim"] + 4), rtol=1e-15)
    assert 768 in set(layer["embed_dim"])


def test_bias_free_count_differs_by_all_four_biases():
    mha = nn.MultiheadAttention(64, 4, bias=False, device="meta")
    n = sum(p.numel() for p in mha.parameters())
    assert n == cost_memory.mha_param_count(64, bias=False)
    assert cost_memory.mha_param_count(64) - n == 4 * 64


def test_encoder_layer_formula_against_torch_layer():
    layer = nn.TransformerEncoderLayer(96, 4, 384, device="meta")
    assert sum(p.numel() for p in layer.parameters()) == cost_memory.encoder_layer_param_count(96, 384)
    assert sum(p.numel() for p in layer.parameters()) != cost_memory.encoder_layer_param_count(96, 385)


def test_architectures_against_torch_modules():
    table = cost_memory.check_architectures(using="torch")
    assert table["match"].all(), table


def test_architectures_against_transformers_models():
    pytest.importorskip("transformers")
    table = cost_memory.check_architectures(["BERT-base", "ViT-B/16", "GPT-2 small"], using="transformers")
    assert table["match"].all(), table
    assert table.set_index("architecture")["model_params_module"].to_dict() == {
        "BERT-base": 109_482_240, "ViT-B/16": 86_389_248, "GPT-2 small": 124_439_808}


def test_memory_table_fractions_and_optimizer_state():
    t = cost_memory.memory_table().set_index("architecture")
    xl = t.loc["GPT-2 XL"]
    assert xl.bk_params == 48 * 1600
    assert xl.bk_adam_state == 2 * xl.bk_params and xl.bk_sgd_momentum_state == xl.bk_params
    assert xl.bk_training_adam_bytes == 4 * 4 * xl.bk_params
    assert (t.bk_fraction_of_model < t.bk_fraction_of_attention_layer).all()
    with pytest.raises(ValueError, match="architecture"):
        cost_memory.architecture_params("GPT-5")


def _memory():
    layer = cost_memory.per_layer_memory(cost_memory.LAYER_WIDTHS)
    memory = cost_memory.memory_table().merge(
        cost_memory.check_architectures(using="torch")[["architecture", "match"]], on="architecture")
    return layer, memory


def _holds(claims, tmp_path) -> dict:
    rec = Recorder("06_cost", tmp_path, profile="smoke", device="cpu")
    return {c["id"]: c["holds"] for c in rec.claims_from(claims)}


def test_memory_claim_is_consistency_and_fails_on_a_wrong_count(tmp_path):
    layer, memory = _memory()
    claims, macros = cost_judge.memory_claims(layer, memory)
    assert [c.id for c in claims] == [cost_judge.COST_MEMORY_COUNTS_MATCH_MODULES.id]
    assert claims[0].kind == "consistency" and claims[0].bound_origin
    assert _holds(claims, tmp_path) == {cost_judge.COST_MEMORY_COUNTS_MATCH_MODULES.id: True}
    assert macros["CostBertEmbedDim"] == 768 and macros["CostBkParamsGptXL"] == 48 * 1600
    assert macros["CostBkFractionLayerPercent"] == pytest.approx(100 / (4 * 768 + 4))
    broken = memory.assign(match=[False] + [True] * (len(memory) - 1))
    assert _holds(cost_judge.memory_claims(layer, broken)[0], tmp_path / "b") == {cost_judge.COST_MEMORY_COUNTS_MATCH_MODULES.id: False}


def test_memory_latex():
    _, memory = _memory()
    tex = cost_show.memory_latex(memory)
    assert tex.startswith(r"\begin{tabular}") and r"\bottomrule" in tex and "GPT-2 XL & 1600 & 48" in tex
    assert "76{,}800" in tex


def test_allocator_check_not_run_without_gpu():
    row = cost_memory.allocator_check(256, "sgd_momentum", "cpu")
    assert row["expected_bytes"] == 4 * 256 * 3
    if not torch.cuda.is_available():
        assert row["status"] == "not run" and row["match"] is None and "no CUDA" in row["reason"]


# ----------------------------------------------------------------------------- the block


def _layer64(norm_first, seed=0):
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=norm_first, dtype=torch.float64)
    with torch.no_grad():
        layer.self_attn.in_proj_bias.normal_(0, 1.0)
        layer.self_attn.out_proj.bias.normal_(0, 0.5)
    return layer


def _x(shape=(3, 7, 32), seed=1):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("norm_first,causal", [(False, False), (True, True), (True, False)])
def test_explicit_block_is_the_torch_layer(norm_first, causal):
    layer = _layer64(norm_first)
    x = _x()
    mask = nn.Transformer.generate_square_subsequent_mask(7, dtype=torch.float64) if causal else None
    ref = layer(x, src_mask=mask, is_causal=causal)
    got = cost_measure.block_forward(cost_measure.block_params(layer), x, num_heads=4, norm_first=norm_first, causal=causal)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def _run(params, x, memory, **kw):
    for p in params.values():
        p.grad = None
    y = cost_measure.block_forward(params, x, memory, num_heads=4, **kw)
    (y * _x(y.shape, seed=9)).sum().backward()
    return y.detach(), {k: p.grad.clone() for k, p in params.items()}


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("norm_first,causal", [(False, False), (True, True)])
def test_block_without_bk_equals_block_with_bk(norm_first, causal, cross):
    layer = _layer64(norm_first)
    full, no_bk = cost_measure.block_params(layer), cost_measure.block_params(layer, key_bias=False)
    assert "b_k" in full and "b_k" not in no_bk
    x, memory = _x(), (_x((3, 5, 32), seed=2) if cross else None)
    kw = dict(norm_first=norm_first, causal=causal)
    y_a, g_a = _run(full, x, memory, **kw)
    y_b, g_b = _run(no_bk, x, memory, **kw)
    torch.testing.assert_close(y_b, y_a, rtol=1e-10, atol=1e-10)
    for k in no_bk:
        torch.testing.assert_close(g_b[k], g_a[k], rtol=1e-9, atol=1e-9)
    assert g_a["b_k"].abs().max() < 1e-9  # the removed parameter had no gradient to give
    with torch.no_grad():
        full["b_k"].zero_()
    torch.testing.assert_close(_run(full, x, memory, **kw)[0], y_b, rtol=1e-13, atol=1e-13)


def test_removing_the_query_bias_instead_changes_the_block():
    layer = _layer64(False)
    full = cost_measure.block_params(layer)
    no_bq = {k: v for k, v in cost_measure.block_params(layer).items() if k != "b_q"}
    x = _x()
    kw = dict(num_heads=4, norm_first=False, causal=False)
    diff = cost_measure.block_forward(full, x, **kw) - cost_measure.block_forward(no_bq, x, **kw)
    assert diff.abs().max() > 1e-3


def test_build_implementations_share_values():
    impls = cost_measure.build_implementations("tiny", seed=3)
    assert set(impls) == set(cost_measure.IMPLEMENTATIONS)
    for k, p in impls["with_bk"].items():
        assert torch.equal(p, impls["control"][k]) and p is not impls["control"][k]
    n = {k: sum(p.numel() for p in v.values()) for k, v in impls.items()}
    assert n["with_bk"] - n["without_bk"] == cost_measure.BLOCKS["tiny"]["embed_dim"]
    with pytest.raises(ValueError, match="block"):
        cost_measure.build_implementations("GPT-5")


# ----------------------------------------------------------------------------- timing


def test_time_block_interleaves_and_splits_phases():
    raw = cost_measure.time_block(block="tiny", seq_len=4, batch=1, attention="cross", mode="training",
                                  min_reps=3, max_reps=3, check_every=1, warmup=1)
    assert raw.attrs["stopped_by"] == "max_reps"
    assert set(raw.implementation) == set(cost_measure.IMPLEMENTATIONS)
    assert len(raw) == 3 * len(cost_measure.IMPLEMENTATIONS) * 4
    assert (raw.seconds >= 0).all()
    tot = raw[raw.phase == "total"].set_index(["rep", "implementation"]).seconds.sort_index()
    parts = raw[raw.phase != "total"].groupby(["rep", "implementation"]).seconds.sum().sort_index()
    np.testing.assert_allclose(tot, parts, rtol=1e-9, atol=1e-12)
    assert (raw[raw.phase == "total"].groupby("rep").implementation.nunique() == 3).all()


def test_time_block_stops_at_the_target_or_the_time_budget():
    kw = dict(block="tiny", seq_len=4, batch=1, attention="self", mode="inference", min_reps=4, max_reps=50,
              check_every=2, warmup=1)
    # The rule, not the machine, is under test: a tiny block's reps stall now and then by 20x
    # (~1 ms on ~50 us), so only a target no finite interval misses makes the first check stop.
    raw = cost_measure.time_block(**kw, target_half_width=1e6)
    assert raw.attrs["stopped_by"] == "target" and raw["rep"].max() + 1 == 4
    raw = cost_measure.time_block(**kw, max_seconds=1e-9)
    assert raw.attrs["stopped_by"] == "max_seconds" and raw["rep"].max() + 1 == 4


@pytest.mark.parametrize("kw,match", [
    ({"attention": "diagonal"}, "attention"), ({"mode": "eval"}, "mode"), ({"optimizer": "lion"}, "optimizer"),
    ({"seq_len": 0}, "seq_len"), ({"clock": "sundial"}, "clock"), ({"block": "GPT-5"}, "block"),
    ({"max_reps": 1, "min_reps": 2}, "max_reps"),
])
def test_time_block_rejects_bad_arguments(kw, match):
    args = dict(block="tiny", seq_len=4, batch=1, attention="self", mode="inference", min_reps=2, max_reps=2, warmup=1)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        cost_measure.time_block(**args)


def test_gpus_are_timed_with_the_wall_clock():
    assert cost_measure.clock_for("cpu", "process") == "process"
    assert cost_measure.clock_for("cuda", "process") == "wall" and cost_measure.clock_for("mps", "wall") == "wall"
    with pytest.raises(ValueError, match="GPU"):
        cost_measure.time_block(block="tiny", seq_len=4, batch=1, attention="self", mode="inference", min_reps=2,
                                max_reps=2, device="cuda", clock="process")


@pytest.mark.parametrize("kw,match", [({"min_reps": 5}, "min_reps"), ({"max_reps": 31, "min_reps": 40}, "max_reps"),
                                      ({"budget_seconds": 0.0}, "budget_seconds"), ({"target_half_width": 1.5}, "target")])
def test_check_settings_refuses_before_work(kw, match):
    args = dict(min_reps=30, max_reps=30, budget_seconds=1.0, target_half_width=0.0)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        cost_measure.check_settings(**args)
    with pytest.raises(ValueError, match=match):
        cost_measure.run_benchmark(cost_measure.block_configs(["tiny"], [4], 1), **args)


def test_block_configs_grid():
    c = cost_measure.block_configs(["BERT-base", "GPT-2 small"], [128, 512], 8)
    assert len(c) == 2 * 2 * 2 * 2 and set(c["embed_dim"]) == {768} and set(c["num_heads"]) == {12}
    with pytest.raises(ValueError, match="block"):
        cost_measure.block_configs(["BERT-huge"], [128], 8)
    with pytest.raises(ValueError, match="seq_lens"):
        cost_measure.block_configs(["tiny"], [], 8)


def test_device_status_and_not_run_rows():
    st = cost_measure.device_status("cpu")
    configs = cost_measure.block_configs(["tiny"], [4], 1, ["self"], ["training"])
    if not torch.cuda.is_available():
        row = st[st.device == "cuda"].iloc[0]
        assert row.status == "not run" and "no CUDA" in row.reason
        frame = pd.DataFrame([{"device": "cpu", "block": "tiny", "ratio": "no_bk", "value": 0.99}])
        out = cost_measure.with_not_run(frame, configs, "cpu")
        extra = out[out.device == "cuda"]
        assert len(extra) == 1 and set(extra.status) == {"not run"} and (extra.reason != "").all()
        assert out.loc[out.device == "cpu", "status"].eq("measured").all()
        medians = pd.DataFrame([{"device": "cpu", "block": "tiny", "implementation": "with_bk", "median_s": 0.1}])
        extra = cost_measure.with_not_run(medians, configs, "cpu").query("device == 'cuda'")
        assert set(extra["implementation"]) == set(cost_measure.IMPLEMENTATIONS) and "ratio" not in extra


# ----------------------------------------------------------------------------- statistics


def test_bootstrap_ratio_identical_half_and_paired_noise():
    rng = np.random.default_rng(0)
    a = 1.0 + 0.05 * rng.random(40)
    r, [(lo, hi)] = cost_stats.bootstrap_ratio(a.copy(), a, n_boot=500, seed=1)
    assert r == pytest.approx(1.0) and lo <= 1.0 <= hi
    r, [(lo, hi)] = cost_stats.bootstrap_ratio(0.5 * a, a, n_boot=500, seed=1)
    assert r == pytest.approx(0.5) and hi < 1.0
    b = a * (1 + 0.01 * rng.standard_normal(40))
    r, [(lo, hi), (alo, ahi)] = cost_stats.bootstrap_ratio(b, a, n_boot=2000, seed=1, levels=(0.95, 0.999))
    assert lo <= 1.0 <= hi and hi - lo < 0.02 and alo <= lo and ahi >= hi
    # the seed is the bootstrap's: another one draws other resamples, so another interval
    assert cost_stats.bootstrap_ratio(b, a, seed=4)[1] != cost_stats.bootstrap_ratio(b, a, seed=5)[1]


@pytest.mark.parametrize("num,den,match", [
    ([1.0, np.nan, 1.0], [1.0, 1.0, 1.0], "finite"), ([1.0, 0.0, 1.0], [1.0, 1.0, 1.0], "positive"),
    ([1.0, 1.0], [1.0, 1.0, 1.0], "paired"),
])
def test_bootstrap_ratio_refuses_bad_timings(num, den, match):
    with pytest.raises(ValueError, match=match):
        cost_stats.bootstrap_ratio(num, den)


def test_trimmed_mean_ignores_disturbed_repetitions():
    rng = np.random.default_rng(2)
    a = np.ones(60)
    b = 0.98 * (1 + 0.002 * rng.standard_normal(60))
    b[:6] *= 3.0  # six repetitions another process slowed down
    r, _ = cost_stats.bootstrap_ratio(b, a, n_boot=200)
    assert r == pytest.approx(0.98, abs=0.002)
    assert np.mean(b / a) > 1.1  # a plain mean would be dragged away


def test_config_seeds_are_the_same_in_another_process():
    """A seed built with Python's hash() would change with PYTHONHASHSEED between two runs of the
    notebook; the configuration's seed must not."""
    import subprocess
    import sys

    code = ("from keybias.studies.cost import stats; "
            "print(stats.config_seed(0, 'cpu', 'BERT-base', 'self', 'training', 128))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": "777"},
                         capture_output=True, text=True, check=True)
    assert int(out.stdout.split()[-1]) == cost_stats.config_seed(0, "cpu", "BERT-base", "self", "training", 128)


def test_config_seeds_differ_per_configuration():
    s1 = cost_stats.config_seed(0, "cpu", "BERT-base", "self", "training", 128)
    assert s1 != cost_stats.config_seed(0, "cpu", "BERT-base", "cross", "training", 128)
    assert s1 != cost_stats.config_seed(1, "cpu", "BERT-base", "self", "training", 128)


# ----------------------------------------------------------------------------- doctored benchmarks


def _doctored_raw(*, n_configs=4, reps=60, saving=0.002, noise=0.003, control_noise=None, control_bias=0.0,
                  step_s=0.25, seed=0, savings=None):
    """Raw timings as run_benchmark returns them: with_bk, without_bk = with_bk * (1 - saving),
    control = with_bk * (1 + control_bias), each with independent multiplicative noise.
    `savings` {config index: saving of the whole pass} overrides `saving` for those configurations."""
    rng = np.random.default_rng(seed)
    control_noise = noise if control_noise is None else control_noise
    savings = savings or {}
    rows = []
    for i in range(n_configs):
        attention, mode = ("self", "cross")[i % 2], ("inference", "training")[(i // 2) % 2]
        cfg = dict(device="cpu", block="BERT-base", attention=attention, mode=mode, embed_dim=768, num_heads=12,
                   seq_len=128 * (1 + i // 4), batch=8)
        phases = cost_measure.PHASES[mode]
        # training also loses the backward reduction: half the forward's bytes again (see removed_work)
        removed = savings.get(i, saving * (1.5 if mode == "training" else 1.0))
        for rep in range(reps):
            drift = 1 + 0.05 * rng.standard_normal()  # shared by the pair: cancels in the ratio
            for impl, factor, sd in (("with_bk", 1.0, noise), ("without_bk", 1 - removed, noise),
                                     ("control", 1 + control_bias, control_noise)):
                parts = [step_s * drift * factor * (1 + sd * rng.standard_normal()) / 3 for _ in range(3)]
                times = {"forward": sum(parts)} if mode == "inference" else dict(
                    zip(("forward", "backward", "step"), parts, strict=True), total=sum(parts))
                rows += [{**cfg, "rep": rep, "position": 0, "implementation": impl, "phase": ph, "seconds": times[ph]}
                         for ph in phases]
    return pd.DataFrame(rows)


def _judged(raw, *, predicted=0.002, step_s=0.25, n_boot=1000, doctor=None):
    """summarize -> (doctor the ratios) -> byte model with a machine whose numbers make the
    model predict `predicted`."""
    _, ratios = cost_stats.summarize(raw, n_boot=n_boot, seed=0)
    if doctor is not None:
        doctor(ratios)
    removed = cost_judge.removed_work(768, 128, 8)
    # one bandwidth for all rows: predicted share of the forward bytes of the S=128 configurations
    machine = {"bandwidth_bytes_per_s": removed["forward_bytes"] / (predicted * step_s), "small_op_s": 0.0,
               "optimizer_param_step_s": {768: 0.0}}
    return ratios, cost_judge.predict_saving(ratios, machine)


# The counted bounds of the BERT-base configurations at S=128 (traffic.saving_bounds with
# torch 2.13): the removed kernel share, 1/18 for inference and 11/192 for a training step.
BOUND = {"inference": 1 / 18, "training": 11 / 192}


def _bounds(raw, bound=None):
    configs = raw[cost_judge.CONFIG_COLUMNS].drop_duplicates()
    share = configs["mode"].map(bound or BOUND)  # the kernel share sets the bound; the byte share is smaller
    return configs.assign(saving_bound=share, removed_kernel_share=share, removed_byte_share=share / 2)


def _saving_holds(raw, tmp_path, *, bounds=None, **kw):
    ratios, model = _judged(raw, **kw)
    claims, macros, machine = cost_judge.saving_claims(model, _bounds(raw) if bounds is None else bounds)
    return _holds(claims, tmp_path), claims, {**macros, **machine}, ratios, model


def test_saving_claim_holds_on_a_clean_benchmark(tmp_path):
    holds, claims, macros, ratios, model = _saving_holds(_doctored_raw(), tmp_path)
    assert holds == {"cost-saving-within-removed-work": True}
    # a machine check of the timings: the registry declares no such claim, and no profile records it
    assert [c.id for c in claims] == [cost_judge.SAVING_CHECK] and cost_judge.SAVING_CHECK not in list_claims()
    assert claims[0].kind == "consistency" and "theory" in claims[0].bound_origin
    assert "issue" not in claims[0].bound_origin
    assert macros["CostSavingsAboveBound"] == 0 and macros["CostFamilySize"] == 4 and macros["CostComparisons"] == 4
    timing = cost_judge.timing_macros(ratios, model)
    assert timing["CostSlower"] == 0 and "no configuration" in timing["CostSlowerSentence"]
    # the largest saving is quoted with its simultaneous (Bonferroni) interval, wider than the 95% one
    top = cost_judge.headline(model).sort_values("measured_saving").iloc[-1]
    assert timing["CostLargestPointSavingLowPercent"] == pytest.approx(100 * top.saving_ci_low_adjusted)
    assert timing["CostLargestPointSavingWhere"] == f"BERT-base, {top.attention}-attention {top['mode']}, 128 tokens, batch 8"
    assert top.saving_ci_low_adjusted < top.saving_ci_low and top.saving_ci_high_adjusted > top.saving_ci_high
    # the smallest saving the design resolves is the saving's median half-width: reported, not claimed
    assert timing["CostMinDetectablePercent"] == pytest.approx(100 * np.median(cost_judge.headline(model)["half_width"]))


# The edge: a saving 5% above its bound in one configuration (a step that loses a little more
# work than b_k carries), timed on a quiet machine (0.3% noise per repetition, 60 repetitions).
EDGE = 1.05


def test_a_saving_just_above_its_bound_fails_the_saving_claim(tmp_path):
    raw = _doctored_raw(savings={3: EDGE * BOUND["training"]})
    holds, claims, macros, *_ = _saving_holds(raw, tmp_path)
    assert holds["cost-saving-within-removed-work"] is False
    assert claims[0].value > 1 and macros["CostSavingLowOverBoundMaxPercent"] > 100


def test_an_inference_saving_just_above_its_bound_fails_the_saving_claim(tmp_path):
    raw = _doctored_raw(savings={0: EDGE * BOUND["inference"]})
    holds, claims, *_ = _saving_holds(raw, tmp_path)
    assert holds["cost-saving-within-removed-work"] is False


def test_a_saving_just_below_its_bound_passes(tmp_path):
    """The claim is no stricter than its bound: 5% under it, the same quiet timing holds."""
    holds, *_ = _saving_holds(_doctored_raw(savings={3: BOUND["training"] / EDGE}), tmp_path)
    assert holds["cost-saving-within-removed-work"] is True


@pytest.mark.parametrize("noise,holds", [(0.003, True), (0.03, True), (0.25, False)])
def test_noise_makes_the_bound_claim_harder_to_pass(tmp_path, noise, holds):
    """The claim asks the whole simultaneous interval to lie within the bound: a machine too noisy
    to resolve it fails, it never passes because of noise."""
    raw = _doctored_raw(noise=noise, saving=0.004, reps=30, seed=7)
    result, *_ = _saving_holds(raw, tmp_path / str(noise))
    assert result["cost-saving-within-removed-work"] is holds


# ----------------------------------------------------------------------------- the byte model, tested
# The prediction P of `_judged` (predicted=0.002): 0.2% of an inference pass; a training step also loses
# the backward reduction, half the forward's bytes again (the optimizer's E entries are negligible).
P = {"inference": 0.002, "training": 0.003}
M = cost_judge.BYTE_MARGIN
MODES = ("inference", "inference", "training", "training")  # the modes of _doctored_raw's configurations 0-3


def _byte(raw, tmp_path, margin=M, **kw):
    ratios, model = _judged(raw, **kw)
    claims, macros, machine = cost_judge.byte_model_claims(model, _bounds(raw), margin)
    return _holds(claims, tmp_path), {c.id: c for c in claims}, {**macros, **machine}


def test_byte_model_claims_hold_when_the_saving_is_the_prediction(tmp_path):
    holds, claims, macros = _byte(_doctored_raw(), tmp_path)
    assert holds == {cost_judge.COST_SAVING_WITHIN_BYTE_PREDICTION.id: True, cost_judge.COST_SAVING_NOT_BELOW_BYTE_PREDICTION.id: True}
    assert all(c.kind == "consistency" and "fixed before this run" in c.bound_origin for c in claims.values())
    assert macros["CostByteMarginPercent"] == pytest.approx(100 * M)
    assert abs(macros["CostByteExcessMaxPercent"]) < 100 * M / 4 and abs(macros["CostByteDeficitMaxPercent"]) < 100 * M / 4


@pytest.mark.claim_mutation(cost_judge.COST_SAVING_WITHIN_BYTE_PREDICTION.id)
@pytest.mark.parametrize("config", [0, 3])
def test_a_saving_one_margin_above_the_prediction_fails(tmp_path, record_mutation, config):
    """The smallest excess the claim exists to catch: a saving whose lower limit lies just past
    P + M in one configuration (B loses more work than b_k), on a quiet machine: a saving of
    P + 1.15 M, the doctored intervals' half-width being under 0.15 M."""
    raw = _doctored_raw(savings={config: P[MODES[config]] + 1.15 * M})
    holds, claims, _ = _byte(raw, tmp_path)
    c = claims[cost_judge.COST_SAVING_WITHIN_BYTE_PREDICTION.id]
    assert 1 < c.value < 1.15, c.value
    assert holds[cost_judge.COST_SAVING_NOT_BELOW_BYTE_PREDICTION.id] is True
    record_mutation(c)


@pytest.mark.claim_mutation(cost_judge.COST_SAVING_NOT_BELOW_BYTE_PREDICTION.id)
@pytest.mark.parametrize("config", [1, 2])
def test_a_saving_one_margin_below_the_prediction_fails(tmp_path, record_mutation, config):
    """B slower than the prediction by exactly M in one configuration (removing b_k picks a slower
    kernel, or the removed bytes cost nothing and B loses elsewhere): its upper limit just below P - M."""
    raw = _doctored_raw(savings={config: P[MODES[config]] - 1.15 * M})
    holds, claims, _ = _byte(raw, tmp_path)
    c = claims[cost_judge.COST_SAVING_NOT_BELOW_BYTE_PREDICTION.id]
    assert 1 < c.value < 1.15, c.value
    assert holds[cost_judge.COST_SAVING_WITHIN_BYTE_PREDICTION.id] is True
    record_mutation(c)


def test_a_saving_inside_the_margin_passes_both(tmp_path):
    raw = _doctored_raw(savings={0: P["inference"] + 0.8 * M, 3: P["training"] - 0.8 * M})
    holds, *_ = _byte(raw, tmp_path)
    assert all(holds.values()), holds


@pytest.mark.parametrize("noise", [0.003, 0.1])
def test_noise_never_fails_the_byte_model_claims_and_is_reported_as_their_resolution(tmp_path, noise):
    """With the true saving equal to the prediction, a quiet and a loaded machine both pass (a claim
    may not depend on the machine's load); the loaded one reports a coarser resolution."""
    raw = _doctored_raw(noise=noise, control_noise=noise, reps=30, seed=7)
    result, claims, macros = _byte(raw, tmp_path / str(noise))
    assert all(result.values()), result
    c = claims[cost_judge.COST_SAVING_WITHIN_BYTE_PREDICTION.id]
    assert c.min_detectable == pytest.approx(macros["CostByteResolutionPercent"] / 100) and c.min_detectable > M
    if noise > 0.05:
        assert c.min_detectable > 2 * M


def test_byte_model_claims_fail_on_nan_and_refuse_empty_input_or_no_margin(tmp_path):
    def nan_in_headline(ratios):
        head = cost_judge.headline(ratios)
        ratios.loc[head.index[head["ratio"] == "no_bk"][0], "ci_low_adjusted"] = np.nan

    raw = _doctored_raw()
    with pytest.raises(NonFiniteValues):  # NaN never passes: it raises
        _byte(raw, tmp_path, doctor=nan_in_headline)
    _, model = _judged(raw)
    with pytest.raises(ValueError, match="headline"):
        cost_judge.byte_model_claims(model.iloc[0:0], _bounds(raw))
    with pytest.raises(ValueError, match="margin"):
        cost_judge.byte_model_claims(model, _bounds(raw), 0.0)
    check = cost_judge.byte_model_check(model, _bounds(raw))
    assert np.allclose(check["byte_excess"], check["saving_ci_low_adjusted"] - check["predicted_saving"])


def test_non_finite_timings_fail_the_claim_and_empty_or_unbounded_input_raises(tmp_path):
    def nan_in_headline(ratios):
        head = cost_judge.headline(ratios)
        ratios.loc[head.index[head["ratio"] == "no_bk"][0], "ci_high_adjusted"] = np.nan

    raw = _doctored_raw()
    ratios, model = _judged(raw, doctor=nan_in_headline)
    with pytest.raises(NonFiniteValues):  # NaN never passes: it raises
        cost_judge.saving_claims(model, _bounds(raw))
    with pytest.raises(ValueError, match="headline"):
        cost_judge.saving_claims(model.iloc[0:0], _bounds(raw))
    with pytest.raises(ValueError, match="bound"):
        cost_judge.saving_claims(model, _bounds(raw).iloc[1:])


def test_resolution_table_reports_what_the_timing_resolved():
    raw = _doctored_raw()
    ratios, _ = _judged(raw)
    configs = raw[cost_judge.CONFIG_COLUMNS].drop_duplicates().assign(reps=60, stopped_by="max_reps",
                                                                       seconds_share=0.25, seconds_spent=1.0)
    table = cost_judge.resolution_table(ratios, configs)
    assert len(table) == 4 and (table["control_half_width"] > 0).all() and (table["saving_half_width"] > 0).all()
    assert set(table["stopped_by"]) == {"max_reps"}


# ----------------------------------------------------------------------------- the counted bound


def test_counted_bound_of_the_bias_broadcast_is_exact():
    """Inference: B drops one kernel (addmm's bias broadcast) and exactly the bytes of b_k plus
    one write and one read of the key projection's output."""
    w = cost_traffic.step_work(block="tiny", seq_len=16, batch=2, attention="self", mode="inference")
    e, bs = cost_measure.BLOCKS["tiny"]["embed_dim"], 2 * 16
    assert w["kernels_with_bk"] - w["kernels_without_bk"] == 1
    assert w["bytes_with_bk"] - w["bytes_without_bk"] == 4 * e + 2 * 4 * bs * e
    assert w["saving_bound"] == max(w["removed_kernel_share"], w["removed_byte_share"]) > 0


def test_counted_bound_of_a_training_step_includes_reduction_and_update():
    w = cost_traffic.step_work(block="tiny", seq_len=16, batch=2, attention="cross", mode="training")
    # the bias broadcast, the reduction for grad b_k and at least one optimizer kernel
    assert w["kernels_with_bk"] - w["kernels_without_bk"] >= 3
    assert 0 < w["saving_bound"] < 0.2
    assert w == cost_traffic.step_work(block="tiny", seq_len=16, batch=2, attention="cross", mode="training")


def test_summarize_seeds_per_configuration_and_family_size():
    raw = _doctored_raw(n_configs=4, reps=30)
    _, ratios = cost_stats.summarize(raw, n_boot=200, seed=0)
    seeds = ratios.groupby(["attention", "mode", "phase"]).bootstrap_seed.first()
    assert seeds.nunique() == len(seeds)
    assert set(ratios.family_size) == {4}
    assert (ratios.ci_low_adjusted <= ratios.ci_low).all() and (ratios.ci_high_adjusted >= ratios.ci_high).all()


def test_verdict_table_gives_bounds_only_where_unresolved():
    _, model = _judged(_doctored_raw(saving=0.02, noise=0.002))
    table = cost_judge.verdict_table(model)
    assert table["resolved"].all() and table["saving_upper_bound"].isna().all()
    _, model = _judged(_doctored_raw(saving=0.0, noise=0.02))
    table = cost_judge.verdict_table(model)
    unresolved = table[~table["resolved"]]
    assert len(unresolved) and (unresolved["saving_upper_bound"] > 0).all()
    tex = cost_show.verdict_latex(table)
    assert r"\le" in tex and tex.count(r"\\") == len(table) + 1


def test_attention_words():
    assert cost_show.attention_words(["self"]) == "self-attention"
    assert cost_show.attention_words(["self", "cross"]).startswith("self-attention and cross-attention")


def test_gpu_prediction_is_labelled_and_computed_from_datasheet_bandwidth():
    configs = cost_measure.block_configs(["BERT-base"], [128], 8)
    gpu = cost_judge.gpu_prediction(configs)
    assert gpu["kind"].str.startswith("prediction").all() and "not measured" in gpu["kind"].iloc[0]
    w = cost_judge.removed_work(768, 128, 8)
    train = gpu[(gpu["mode"] == "training") & (gpu["gpu_tag"] == "HOneHundred")].iloc[0]
    assert train.predicted_saving_us == pytest.approx(1e6 * (w["forward_bytes"] + w["backward_bytes"] + w["step_bytes"]) / 3.35e12)
    macros = cost_judge.gpu_macros(gpu)
    assert all(name.isalpha() for name in macros) and macros["CostGpuHTwoHundredBandwidthTBs"] == pytest.approx(4.8)


def test_time_saving_figure_is_print_sized():
    ratios, model = _judged(_doctored_raw(n_configs=4, reps=30), n_boot=200)
    fig = cost_show.time_saving_figure(model, ratios, device="cpu", threads=1)
    assert fig.get_figwidth() == pytest.approx(style.FULL_WIDTH)
    assert style.smallest_font_pt(fig) >= style.MIN_FONT_PT
    assert len(fig.axes) == 2


# ----------------------------------------------------------------------------- parameters and CLI


@pytest.mark.parametrize("profile", ["smoke", "paper"])
def test_profiles_set_exactly_the_parameters(profile):
    checked = load_profile(profile, ROOT / "params", ["06_cost"])["06_cost"]
    assert set(checked) == set(cost.PARAMETERS)
    assert cost.CostConfig.from_mapping(checked).as_dict() == checked  # the repetition settings agree too


def test_config_defaults_are_the_smoke_profile_and_fields_are_the_parameters():
    import dataclasses

    assert {f.name for f in dataclasses.fields(cost.CostConfig)} == set(cost.PARAMETERS)
    smoke = load_profile("smoke", ROOT / "params", ["06_cost"])["06_cost"]
    assert cost.CostConfig().as_dict() == smoke
    grid = cost_measure.config_grid(cost.CostConfig())
    assert len(grid) == len(cost_measure.block_configs(["tiny"], [16], 2, ["self", "cross"], ["inference", "training"]))


def test_config_rejects_misspelled_and_inconsistent_values_naming_them():
    from keybias.studies.params import ParameterError

    with pytest.raises(ParameterError, match="did you mean 'max_reps'"):
        cost.CostConfig.from_mapping({"max_rep": 40})
    with pytest.raises(ParameterError, match="max_reps"):
        cost.CostConfig(min_reps=40, max_reps=30)
    with pytest.raises(ParameterError, match="blocks"):
        cost.CostConfig(blocks=["BERT-huge"])
    with pytest.raises(ParameterError, match="seq_lens"):
        cost.CostConfig(seq_lens=[])


def test_paper_profile_times_bert_base_within_a_bounded_budget():
    checked = load_profile("paper", ROOT / "params", ["06_cost"])["06_cost"]
    assert "BERT-base" in checked["blocks"] and checked["batch"] == 8
    # the timing stops at the budget past min_reps: notebook 06 must fit about 150 s on 2 cores. The
    # byte-model claims need at least 30 repetitions; on a quiet 2-core AVX2 machine (0.7 s a training
    # step, 0.23 s a forward) 30 of each, three implementations, fit the budget, so only a busy
    # machine runs longer
    assert checked["budget_seconds"] <= 100 and cost_measure.MIN_REPS <= checked["min_reps"] <= 30
    assert 3 * checked["min_reps"] * (0.7 + 0.23) <= checked["budget_seconds"]


def test_machine_specific_outputs_cover_timings_only():
    import fnmatch

    def machine(rel):
        return any(fnmatch.fnmatch(rel, p) for p in cost.MACHINE_SPECIFIC_OUTPUTS)

    assert machine("machine/cost_timing_ratios.csv") and machine("figures/cost_time_saving.pdf")
    assert machine("tables/cost_timing_verdicts.tex") and machine("macros/06_cost_machine.tex")
    assert not machine("macros/06_cost.tex") and not machine("data/cost_saving_bounds.csv")
    assert not machine("data/cost_memory.csv") and not machine("data/cost_gpu_prediction.csv")


@pytest.mark.parametrize("argv", [[], ["--full", "--quick"], ["--quick", "--device", "tpu"], ["--quick", "--threads", "0"],
                                  ["--quick", "--budget-seconds", "-1"]])
def test_cli_refuses_bad_arguments(argv):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2


def test_cli_quick_writes_machine_files(tmp_path):
    assert bench.main(["--quick", "--out", str(tmp_path), "--threads", "1"]) == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert {"cost_bench_ratios.csv", "cost_bench_verdicts.csv", "cost_bench_gpu_prediction.csv",
            "cost_bench_provenance.json", "cost_bench_saving_bounds.csv", "cost_bench_resolution.csv",
            "cost_bench_saving_claim.csv"} <= names
    claim = pd.read_csv(tmp_path / "cost_bench_saving_claim.csv").iloc[0]
    # the quick grid's tiny block resolves nothing (steps of a fraction of a millisecond), and the claim
    # asks its whole interval to lie within the bound, so on a busy machine it may not hold: the quick
    # run checks the command, its outcome is a machine output
    assert claim["id"] == "cost-saving-within-removed-work" and np.isfinite(claim["value"]) and claim["bound"] == 1
    ratios = pd.read_csv(tmp_path / "cost_bench_ratios.csv")
    assert set(ratios["status"]) >= {"measured"}
    run = pd.read_csv(tmp_path / "cost_bench_configs.csv")
    # one shared budget, inference first; a spent budget still gives every configuration min_reps
    assert list(run["mode"]) == sorted(run["mode"]) and (run["reps"] >= 30).all()
    assert run["seconds_share"].iloc[-1] <= cost.QUICK_BENCH["budget_seconds"]
    import json

    measured = json.loads((tmp_path / "cost_bench_provenance.json").read_text())["measured"]
    assert {"load_average_before", "load_average_after", "cores", "bandwidth_bytes_per_s"} <= set(measured)


# ----------------------------------------------------------------------------- a busy machine


def test_notebook_passes_its_claims_with_every_core_busy(tmp_path):
    """Notebook 06 on the smoke profile while a CPU-burning process runs on every core: the notebook
    runs and its claims hold (the smoke profile's byte margin is the whole pass: its tiny block
    resolves nothing, so the claims exercise the code only), and the resolution the timing reached is
    written as a machine output. In the paper profile noise cannot fail the byte-model claims either;
    it coarsens their stated resolution (`test_noise_never_fails_the_byte_model_claims_and_is_reported_as_their_resolution`)."""
    import json
    import subprocess
    import sys

    from keybias.pipeline import steps as pipeline

    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        os.environ["JUPYTER_PATH"] = str(Path(sys.prefix) / "share" / "jupyter")
        code = pipeline.main(["--profile", "smoke", "--device", "cpu", "--results", str(tmp_path), "notebooks",
                              "--only", "06_cost"])
    finally:
        for p in burners:
            p.kill()
            p.wait()
    assert code == 0
    claims = json.loads((tmp_path / "steps" / "06_cost.json").read_text())["claims"]
    assert {c["id"]: c["holds"] for c in claims} == {cost_judge.COST_MEMORY_COUNTS_MATCH_MODULES.id: True,
                                                      cost_judge.COST_SAVING_WITHIN_BYTE_PREDICTION.id: True,
                                                      cost_judge.COST_SAVING_NOT_BELOW_BYTE_PREDICTION.id: True}
    machine = (tmp_path / "macros" / "06_cost_machine.tex").read_text()
    assert r"\CostMinDetectablePercent" in machine and r"\CostLoadBefore" in machine
    assert r"\input{../results/macros/06_cost_machine.tex}" in (tmp_path / "macros" / "06_cost.tex").read_text()
    assert "CostMinDetectablePercent" not in (tmp_path / "macros" / "06_cost.tex").read_text()
    assert (tmp_path / "machine" / "cost_resolution.csv").exists()


def test_machine_macros_go_to_their_own_file(tmp_path):
    """The counts stay comparable: timing macros live in macros/<notebook>_machine.tex, which the
    notebook's macro file inputs, and a name is defined once across both files."""
    rec = Recorder("06_cost", tmp_path, profile="smoke", device="cpu")
    rec.macro("CostBatch", 8)
    rec.machine_macro("CostLoadBefore", 1.25, 2)
    with pytest.raises(ValueError, match="twice"):
        rec.macro("CostLoadBefore", 1.0)
    with pytest.raises(ValueError, match="twice"):
        rec.machine_macro("CostBatch", 8)
    step = rec.finish()
    main = (tmp_path / "macros" / "06_cost.tex").read_text()
    machine = (tmp_path / "macros" / "06_cost_machine.tex").read_text()
    assert r"\newcommand{\CostBatch}{8}" in main and "CostLoadBefore" not in main
    assert main.rstrip().endswith(r"\input{../results/macros/06_cost_machine.tex}")
    assert r"\newcommand{\CostLoadBefore}{1.2}" in machine or r"\newcommand{\CostLoadBefore}{1.3}" in machine
    assert {"macros/06_cost.tex", "macros/06_cost_machine.tex"} <= set(step["outputs"])
