"""keybias.pretrained: offline loading of all-MiniLM-L6-v2 and the embedding comparisons."""

from __future__ import annotations

import os
from pathlib import Path

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
    # and a different model would not match: a random query-bias change is visible
    assert (ours - theirs.roll(1, 0)).abs().max() > 1e-2


def test_embedding_changes_verdicts_small():
    changes, norms, info = pretrained.embedding_changes(
        6, 3, 64, 10.0, 0, noise_batch_size=2, dtypes=["float32", "float64"], num_threads=1)
    verdicts = dict(zip(changes["dtype"] + "/" + changes["variant"], changes["verdict"], strict=True))
    for v in ("strip_key_bias", "zero_key_bias", "random_key_bias", "fold_value_bias", "strip_and_fold"):
        assert verdicts[f"float32/{v}"] == "redundant"
    assert verdicts["float32/random_query_bias_control"] == "not_redundant"
    f64 = changes[changes["dtype"] == "float64"]
    assert (f64["max_abs_diff"] < 1e-12).all()
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


def test_drift_prediction_says_when_missing(tmp_path):
    assert pretrained.adam_drift_prediction(tmp_path).startswith("not available")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "training_drift.csv").write_text("step,bk_norm\n0,0.0\n10,0.5\n")
    assert "0.5" in pretrained.adam_drift_prediction(tmp_path)


@pytest.mark.parametrize("profile", ["paper", "smoke"])
def test_profiles_set_every_parameter(profile):
    checked = params.load_profile(profile, ROOT / "params", ["05_pretrained"])["05_pretrained"]
    assert set(checked) == set(pretrained.PARAMETERS)
    if profile == "paper":
        assert checked["n_sentences"] >= 100
