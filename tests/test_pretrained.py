"""keybias.pretrained: offline loading of all-MiniLM-L6-v2 and the embedding comparisons."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
import torch

from keybias import params, pretrained

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def loaded():
    return pretrained.load_model("float32")


def test_sentences_are_fixed_varied_and_enough():
    a = pretrained.sentences(120, 0)
    assert a == pretrained.sentences(120, 0)
    assert len(set(a)) == 120
    assert len({len(s.split()) for s in a}) >= 10  # varied lengths
    with pytest.raises(ValueError, match="n_sentences"):
        pretrained.sentences(1)


def test_load_is_offline_from_the_package_folder(loaded):
    path = pretrained.model_path()
    assert (path / "model.safetensors").is_file()
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["TRANSFORMERS_OFFLINE"] == "1"
    tok, model = loaded
    assert model.config.num_hidden_layers == 6 and model.config.hidden_size == 384
    with pytest.raises(ValueError, match="dtype"):
        pretrained.load_model("float16")


def test_embeddings_match_sentence_transformers(loaded):
    st = pytest.importorskip("sentence_transformers")
    tok, model = loaded
    texts = pretrained.sentences(6, 0)
    ours, _ = pretrained.embed(model, tok, texts, batch_size=4, max_length=256)
    ref = st.SentenceTransformer(str(pretrained.model_path()), device="cpu", local_files_only=True)
    theirs = torch.as_tensor(ref.encode(texts, batch_size=4, convert_to_numpy=True))
    assert torch.allclose(ours, theirs, atol=1e-5)
    # the comparison can fail: the same sentences through a model whose query biases were
    # replaced (the positive control of the notebook) no longer match sentence-transformers
    changed, _ = pretrained._variant(model, "random_query_bias_control", [1.0] * 6, 10.0,
                                     torch.Generator().manual_seed(0))
    other, _ = pretrained.embed(changed, tok, texts, batch_size=4, max_length=256)
    assert not torch.allclose(other, theirs, atol=1e-5)


def test_embedding_changes_verdicts_small():
    changes, norms, info = pretrained.embedding_changes(
        6, 3, 64, 10.0, 0, noise_batch_size=2, dtypes=["float32", "float64"], num_threads=1)
    verdicts = dict(zip(changes["dtype"] + "/" + changes["variant"], changes["verdict"], strict=True))
    for v in ("strip_key_bias", "zero_key_bias", "random_key_bias", "fold_value_bias", "strip_and_fold"):
        assert verdicts[f"float32/{v}"] == "redundant"
    assert verdicts["float32/random_query_bias_control"] == "not_redundant"
    f64 = changes[changes["dtype"] == "float64"].set_index("variant")
    # float64 has its own positive control, and the key-bias changes stay at float64 rounding
    assert verdicts["float64/random_query_bias_control"] == "not_redundant"
    assert f64.loc["random_query_bias_control", "max_abs_diff"] > 1e-3
    assert (f64.drop(index="random_query_bias_control")["max_abs_diff"] < 1e-12).all()
    f32 = changes[changes["dtype"] == "float32"]
    # every float32 row (zero_key_bias and the control included) uses its float64 twin
    assert (f32["tolerance_kind"] == "measured").all()
    assert (f32["tolerance"] <= f32["analytic_tolerance"]).all()
    assert info["strip_report"]["parameters_saved"] == 6 * 384
    assert list(norms.columns[:4]) == ["layer", "bq_norm", "bk_norm", "bv_norm"]
    assert (norms["bk_norm"] > 0).all()


@pytest.mark.parametrize("kwargs, match", [
    (dict(dtypes=["bfloat16"]), "dtypes"),
    (dict(noise_batch_size=3), "noise_batch_size"),
    (dict(num_threads=0), "num_threads"),
])
def test_embedding_changes_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pretrained.embedding_changes(6, 3, 64, 10.0, 0, **kwargs)


def test_reference_savings_match_configs():
    frame = pretrained.reference_savings()
    assert list(frame["model"]) == list(pretrained.REFERENCE_MODELS)
    assert (frame["key_bias_parameters"] == frame["config_count"]).all()
    assert frame.set_index("model").loc["bert-large", "key_bias_parameters"] == 24 * 1024


def test_gpt2_packed_slice_is_read_off_the_module():
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    with torch.device("meta"):
        gpt = GPT2Model(GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=10, n_positions=8))
        bert = BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=64, vocab_size=10))
    for which in ("query", "key", "value"):
        assert pretrained.gpt2_packed_bias_slice(gpt, which) == 3 * 32
    assert pretrained.gpt2_packed_bias_slice(bert) == 0  # no c_attn: nothing counted
    with pytest.raises(ValueError, match="which"):
        pretrained.gpt2_packed_bias_slice(gpt, "output")


def _fake_changes(strip_diff=1e-7, dtypes=("float32",)):
    rows = []
    for dtype in dtypes:
        for variant in ("rebatch_unchanged", *pretrained.VARIANTS):
            diff = {"strip_key_bias": strip_diff, "random_query_bias_control": 0.5}.get(variant, 1e-7)
            rows.append({"dtype": dtype, "variant": variant, "max_abs_diff": diff, "min_cosine": 1 - diff,
                         "tolerance": 1e-4, "tolerance_kind": "analytic", "over_noise_floor": diff / 1e-7,
                         "parameters_saved": 2 * 8 if variant == "strip_and_fold" else 8})
    return pd.DataFrame(rows)


def _fake_info():
    return {"sentences": 4, "n_layers": 2, "hidden_size": 4, "n_parameters": 1000, "num_threads": 1,
            "strip_report": {"parameters_saved": 8}}


def _holds(claim):
    _id, _statement, value, bound, op = claim
    return {"<=": value <= bound, ">": value > bound, "<": value < bound, "==": value == bound}[op]


def test_pretrained_claims_pass_and_fail():
    norms = pd.DataFrame({"layer": [0, 1], "bq_norm": [1.0, 2.0], "bk_norm": [0.1, 0.2], "bv_norm": [1.0, 1.0],
                          "bk_over_key_norm": [0.01, 0.02], "key_norm_median": [5.0, 6.0]})
    ref = pd.DataFrame([{"model": "gpt2", "layers": 12, "hidden_size": 768, "total_parameters": 10**8,
                         "key_bias_parameters": 9216, "value_bias_parameters": 9216, "config_count": 9216,
                         "fraction_key_bias": 9e-5, "counted_by": "x"}])
    changes = _fake_changes()
    savings = pretrained.parameters_saved(changes, _fake_info(), ref)
    assert savings.loc[0, "value_bias_parameters"] == 8
    claims, macros = pretrained.pretrained_claims(changes, norms, _fake_info(), savings)
    by_id = {c[0]: c for c in claims}
    assert all(_holds(c) for c in claims)
    assert "pretrained-control-detected-float64" not in by_id  # no float64 run: no claim
    assert macros["PretStripDiffFloatSixtyFour"] == r"\text{(not run)}"
    assert macros["PretTolMeasuredCount"] == 0 and "analytic" in macros["PretTolSentence"]
    # a strip that changes the output beyond rounding makes its claim fail
    bad, _ = pretrained.pretrained_claims(_fake_changes(strip_diff=1e-2), norms, _fake_info(), savings)
    assert not _holds({c[0]: c for c in bad}["pretrained-strip-key-bias-within-rounding-float32"])
    # key bias larger than the query bias in one layer: that claim fails
    big = norms.assign(bk_norm=[0.1, 3.0])
    worse, _ = pretrained.pretrained_claims(changes, big, _fake_info(), savings)
    assert not _holds(worse[0])
    # float64 rows bring their own control claim
    both, _ = pretrained.pretrained_claims(_fake_changes(dtypes=("float32", "float64")), norms, _fake_info(), savings)
    assert _holds({c[0]: c for c in both}["pretrained-control-detected-float64"])


def test_bias_norm_outputs():
    norms = pd.DataFrame({"layer": [0, 1], "bq_norm": [1.0, 2.0], "bk_norm": [0.1, 0.2], "bv_norm": [1.0, 1.0],
                          "wk_fro_over_sqrt_din": [1.0, 1.0], "key_norm_median": [5.0, 6.0],
                          "bk_over_key_norm": [0.02, 0.03]})
    assert r"$\|b_k\|$" in pretrained.bias_norms_latex(norms)
    fig = pretrained.bias_norms_figure(norms)
    assert len(fig.axes[0].lines) == 3


@pytest.mark.parametrize("profile", ["paper", "smoke"])
def test_profiles_set_every_parameter(profile):
    checked = params.load_profile(profile, ROOT / "params", ["05_pretrained"])["05_pretrained"]
    assert set(checked) == set(pretrained.PARAMETERS)
    if profile == "paper":
        assert checked["n_sentences"] >= 100
