"""The sweep: verdicts on configurations built to be redundant and built not to be."""

from pathlib import Path

import pytest
import torch
import yaml

from keybias import sweep as S

ROOT = Path(__file__).resolve().parents[1]
MAGS = [1.0, 100.0]


def _measure(**kw):
    cfg = S._base(**kw)
    row = S.run_sweep([cfg], MAGS, progress=False).iloc[0].to_dict()
    return row


def test_plain_mha_redundant_float32_and_float64():
    for dt in ("float64", "float32"):
        row = _measure(dtype=dt, mode="eval")
        assert row["verdict"] == "redundant", row
        assert row["grad_verdict"] == "redundant"
        assert row["max_rel_bq"] > 1e-2 and row["max_rel_bv"] > 1e-2  # the controls see changes


def test_add_zero_attn_not_redundant():
    row = _measure(add_zero_attn=True, option="add_zero_attn", mode="eval")
    assert row["verdict"] == "not_redundant"
    assert row["expected"] == "not_redundant" and "(A1)" in row["assumption"]
    assert row["grad_verdict"] == "not_redundant"


def test_add_bias_kv_redundant_only_jointly():
    row = _measure(add_bias_kv=True, option="add_bias_kv", mode="train")
    assert row["verdict"] == "not_redundant"
    assert row["verdict_joint"] == "redundant"


def test_rope_not_redundant_alibi_redundant():
    rope = _measure(family="variants", case="variant rope", variant="rope", embed_dim=16)
    alibi = _measure(family="variants", case="variant alibi", variant="alibi", embed_dim=16)
    assert rope["verdict"] == "not_redundant"
    assert alibi["verdict"] == "redundant"


def test_single_key_has_no_power():
    row = _measure(tgt_len=4, src_len=1, self_attention=False)
    assert row["verdict"] == "invalid" and row["expected"] == "invalid"
    assert row["max_rel_bq"] == 0.0


def test_low_precision_redundant_and_not():
    assert _measure(dtype="bfloat16", mode="eval")["verdict"] == "redundant"
    assert _measure(dtype="bfloat16", mode="eval", add_zero_attn=True)["verdict"] == "not_redundant"


def test_fast_path_detected_only_in_inference():
    fast = _measure(mode="inference")
    slow = _measure(mode="inference_no_fastpath")
    train = _measure(mode="train")
    assert fast["code_path"] == "mha_fast_path"
    assert slow["code_path"].startswith("slow_path") and train["code_path"].startswith("slow_path")


def test_forced_sdpa_backend_recorded():
    row = _measure(family="sdpa", case="SDPA MATH", sdpa_backend="MATH", embed_dim=16)
    assert row["sdpa_backend_used"] == "MATH" and row["verdict"] == "redundant"


def test_rejections_and_skips_are_rows():
    rejected = _measure(mask="is_causal_only")
    assert rejected["status"] == "rejected" and "is_causal" in rejected["reason"]
    assert rejected["verdict"] == "skipped"
    nobias = _measure(bias=False, option="bias_false")
    assert nobias["status"] == "no_key_bias" and nobias["verdict"] == "skipped"


def _kw(**over):
    kw = dict(families=["mha"], embed_dims=[4], num_heads=[2], seq_len=3, batch_size=1, options=["plain"],
              modes=["eval"], masks=["none"], need_weights=[False], batch_first=[True], dtypes=["float32"],
              sizes=["2:1:1:1:1"], size_dtypes=["float32"], variants=["softmax"], hf_models=["gpt2"])
    kw.update(over)
    return kw


@pytest.mark.parametrize("bad", [{"dtypes": ["float8"]}, {"options": ["gated"]}, {"device": "tpu"},
                                 {"masks": ["diagonal"]}, {"sizes": ["4:3:1:1:1"]}, {"families": ["jax"]}])
def test_bad_input_raises_before_work(bad):
    with pytest.raises(ValueError):
        S.build_configs(**_kw(**bad))


def test_absent_devices_become_skipped_rows():
    cfgs = S.build_configs(**_kw())
    df = S.run_sweep(cfgs, [1.0], progress=False)
    for dev in ("cuda", "mps"):
        rows = df[df.device == dev]
        present = torch.cuda.is_available() if dev == "cuda" else torch.backends.mps.is_available()
        if not present:
            assert (rows.verdict == "skipped").all() and len(rows) == 1
            assert "not present" in rows.reason.iloc[0]


def test_parameters_match_profiles():
    for prof in ("paper", "smoke"):
        section = yaml.safe_load((ROOT / "params" / f"{prof}.yaml").read_text())["02_invariance"]
        assert set(section) == set(S.PARAMETERS)
        for name, spec in S.PARAMETERS.items():
            spec.check(name, section[name])


def test_drop_verdict():
    plain = _measure(mode="eval")
    rope = _measure(family="variants", case="variant rope", variant="rope", embed_dim=16)
    assert plain["drop_verdict"] == "redundant" and plain["max_rel_drop"] < 1e-5
    assert rope["drop_verdict"] == "not_redundant"


def test_hf_families_offline():
    """GPT-2's fused key bias is redundant; Qwen2's (followed by RoPE) is not."""
    gpt2 = _measure(family="hf", case="HF gpt2", variant="gpt2", hf_attn_implementation="eager")
    qwen = _measure(family="hf", case="HF qwen2", variant="qwen2", hf_attn_implementation="sdpa")
    assert gpt2["verdict"] == "redundant", gpt2.get("reason")
    assert qwen["verdict"] == "not_redundant", qwen.get("reason")


def test_fully_masked_row_recorded_not_hidden():
    """A6 fails for the masked query: NaN on the explicit-softmax path, the out_proj bias on SDPA's."""
    nan = _measure(mask="fully_masked_row", need_weights=True, mode="eval")
    zero = _measure(mask="fully_masked_row", need_weights=False, mode="eval")
    assert nan["masked_row_output"] == "nan" and nan["nonfinite_outputs"] == 8 * 2  # E=8 entries x batch 2
    assert zero["masked_row_output"] == "out_proj_bias" and zero["nonfinite_outputs"] == 0
    assert nan["verdict"] == zero["verdict"] == "redundant"  # the rows that see a key
    kv = _measure(mask="fully_masked_row", add_bias_kv=True, option="add_bias_kv", mode="eval")
    assert kv["masked_row_output"] == "appended_slots" and kv["nonfinite_outputs"] == 0
    plain = _measure(mode="eval")
    assert plain["nonfinite_outputs"] == 0 and plain["masked_row_output"] == ""


def _small_sweep():
    cfgs = S.build_configs(**_kw(options=["plain", "add_zero_attn", "bias_false"],
                                 masks=["none", "fully_masked_row", "is_causal_only"]))
    return cfgs, S.run_sweep(cfgs, [1.0], progress=False)


def test_expected_measurable_is_a_true_lower_bound():
    cfgs, df = _small_sweep()
    n = S.expected_measurable(cfgs)
    assert n == (df.status == "measured").sum()  # exact here: bias_false, is_causal_only, devices
    assert n < len(cfgs)
    assert S.config_target(cfgs, "paper") == S.TARGET_CONFIGS
    assert S.config_target(cfgs, "smoke") == n


def test_invariance_claims_hold_then_fail():
    cfgs, df = _small_sweep()
    out = S.invariance_claims(df, seconds=2.0, min_configs=S.expected_measurable(cfgs))
    claims = {c[0]: c for c in out["claims"]}
    ops = {"<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b}
    assert all(ops[c[4]](c[2], c[3]) for c in claims.values()), claims
    assert out["macros"]["InvConfigCount"] == (df.status == "measured").sum() < out["macros"]["InvConfigTotal"]
    # a mixed category says how many of each prediction it checked
    zero = claims["invariance-mha-add-zero-attn"][1]
    assert "expected redundant" in zero and "expected not redundant" in zero
    assert "invariance-fully-masked-row-output" in claims
    # a wrong verdict makes the matching claims fail
    bad = df.copy()
    i = bad.index[(bad.status == "measured") & (bad.verdict == "redundant")][0]
    bad.loc[i, "verdict"] = "not_redundant"
    worse = {c[0]: c for c in S.invariance_claims(bad, seconds=2.0, min_configs=1)["claims"]}
    assert worse["invariance-matches-theory"][2] == 1
    # too few measured configurations fails the count claim
    few = {c[0]: c for c in S.invariance_claims(df, seconds=2.0, min_configs=10**6)["claims"]}
    assert not few["invariance-config-count"][2] >= few["invariance-config-count"][3]


def test_invariance_claims_without_data_do_not_pass():
    _, df = _small_sweep()
    nored = df[df.expected != "redundant"]
    out = S.invariance_claims(nored, seconds=1.0, min_configs=1)
    noise = {c[0]: c for c in out["claims"]}["invariance-float64-noise-floor"]
    assert noise[2] != noise[2]  # NaN: the claim fails instead of passing on nothing
    nomask = df[df["mask"] != "fully_masked_row"]
    skipped = dict(S.invariance_claims(nomask, seconds=1.0, min_configs=1)["skipped"])
    assert "invariance-fully-masked-row-output" in skipped
    with pytest.raises(ValueError):
        S.invariance_claims(df, seconds=0.0, min_configs=1)
