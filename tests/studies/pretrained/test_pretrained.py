"""keybias.studies.pretrained.measure: offline loading of all-MiniLM-L6-v2 and the embedding comparisons."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
import torch

from keybias.core.claimspec import list_claims, spec_of
from keybias.core.reduce import NonFiniteValues
from keybias.studies import params
from keybias.studies.pretrained import judge as pretrained_judge
from keybias.studies.pretrained import measure as pretrained
from keybias.studies.pretrained import show as pretrained_show

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[3]


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
    changes, norms, info = pretrained.embedding_changes(pretrained.PretrainedConfig(
        n_sentences=6, batch_size=3, max_length=64, random_bias_scale=10.0, seed=0, noise_batch_size=2,
        dtypes=["float32", "float64"], num_threads=1))
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
    (dict(dtypes=["float32", "float32"]), "dtypes"),
    (dict(dtypes=["float32"]), "must include float64"),
    (dict(noise_batch_size=3), "noise_batch_size"),
    (dict(num_threads=0), "num_threads"),
    (dict(n_sentence=6), "did you mean 'n_sentences'"),
])
def test_config_rejects_bad_input_before_work(kwargs, match):
    from keybias.studies.params import ParameterError

    with pytest.raises(ParameterError, match=match):
        pretrained.PretrainedConfig.from_mapping(dict(dict(n_sentences=6, batch_size=3), **kwargs))
    with pytest.raises(TypeError):
        pretrained.embedding_changes(6, 3, 64, 10.0, 0)  # a config, passed whole, or nothing


def test_config_defaults_are_the_smoke_profile_and_fields_are_the_parameters():
    import dataclasses
    from pathlib import Path

    from keybias.studies import params

    assert {f.name for f in dataclasses.fields(pretrained.PretrainedConfig)} == set(pretrained.PARAMETERS)
    root = Path(__file__).resolve().parents[3] / "params"
    smoke = params.load_profile("smoke", root, ["05_pretrained"])["05_pretrained"]
    assert pretrained.PretrainedConfig().as_dict() == smoke
    paper = params.load_profile("paper", root, ["05_pretrained"])["05_pretrained"]
    assert pretrained.PretrainedConfig.from_mapping(paper).as_dict() == paper


def test_change_macro_names_are_literal_and_follow_the_pattern():
    """The literal names (grep from paper/ finds them) are Pret<variant><quantity><dtype>, with the
    dtype word of the one dtype-name map."""
    from keybias.studies.params import DTYPE_MACRO

    short = {"strip_key_bias": "Strip", "zero_key_bias": "Zero", "random_key_bias": "Random",
             "fold_value_bias": "Fold", "strip_and_fold": "Both", "random_query_bias_control": "Control",
             "rebatch_unchanged": "Noise"}
    expected = {(d, v): tuple(f"Pret{s}{q}{DTYPE_MACRO[d]}" for q in ("Diff", "CosGap", "Tol", "OverNoise"))
                for d in ("float32", "float64") for v, s in short.items()}
    assert pretrained_judge.CHANGE_MACROS == expected
    assert set(short) == {"rebatch_unchanged", *pretrained.VARIANTS}


def test_reference_savings_match_configs():
    frame = pretrained.reference_savings()
    assert list(frame["model"]) == list(pretrained.REFERENCE_MODELS)
    assert (frame["key_bias_parameters"] == frame["config_count"]).all()
    assert (frame["value_bias_parameters"] == frame["config_count"]).all()
    assert frame.set_index("model").loc["bert-large", "key_bias_parameters"] == 24 * 1024


def _fake_changes(strip_diff=1e-7, dtypes=("float32", "float64")):
    """Rows as `embedding_changes` writes them: float32 tolerances measured against the float64 twin."""
    rows = []
    for dtype in dtypes:
        kind = "measured" if dtype == "float32" and "float64" in dtypes else "analytic"
        for variant in ("rebatch_unchanged", *pretrained.VARIANTS):
            diff = {"strip_key_bias": strip_diff, "random_query_bias_control": 0.5}.get(variant, 1e-7)
            rows.append({"dtype": dtype, "variant": variant, "max_abs_diff": diff, "min_cosine": 1 - diff,
                         "tolerance": 1e-4, "tolerance_kind": kind, "over_noise_floor": diff / 1e-7,
                         "parameters_saved": 2 * 8 if variant == "strip_and_fold" else 8})
    return pd.DataFrame(rows)


def _fake_info():
    return {"sentences": 4, "n_layers": 2, "hidden_size": 4, "n_parameters": 1000, "num_threads": 1,
            "strip_report": {"parameters_saved": 8}}


def _holds(claim):
    return claim.holds


NORMS = pd.DataFrame({"layer": [0, 1], "bq_norm": [1.0, 2.0], "bk_norm": [0.1, 0.2], "bv_norm": [1.0, 1.0],
                      "bk_over_key_norm": [0.01, 0.02], "key_norm_median": [5.0, 6.0]})
REF = pd.DataFrame([{"model": "gpt2", "layers": 12, "hidden_size": 768, "total_parameters": 10**8,
                     "key_bias_parameters": 9216, "value_bias_parameters": 9216, "config_count": 9216,
                     "fraction_key_bias": 9e-5, "counted_by": "x"}])
# every declared no-change claim (keybias.core.claimspec), of every kind
CHANGE_IDS = list_claims("pretrained-*-within-rounding-*", notebook="05_pretrained")


def _claims(changes, norms=NORMS):
    savings = pretrained.parameters_saved(changes, _fake_info(), REF)
    claims, macros = pretrained_judge.pretrained_claims(changes, norms, _fake_info(), savings)
    return {c.id: c for c in claims}, macros


def test_pretrained_claims_hold_on_good_data_with_kinds():
    claims, macros = _claims(_fake_changes())
    assert all(_holds(c) for c in claims.values())
    assert all(claims[c.id].kind == spec_of(c.id).kind and c.bound_origin for c in claims.values())
    tested = [cid for cid, c in claims.items() if c.kind == "test"]
    assert tested == list_claims("pretrained-*-within-rounding-*", notebook="05_pretrained", kind="test")
    # the tool's own edits restate its float64 certification; the hand-made random b_k is the test
    for variant in pretrained_judge.TOOL_CERTIFIED:
        assert claims[f"pretrained-{variant.replace('_', '-')}-within-rounding-float64"].kind == "consistency"
    for dtype in ("float32", "float64"):
        control = claims[f"pretrained-control-detected-{dtype}"]
        assert control.kind == "control" and control.protects == tuple(tested)
    for variant, parent in pretrained_judge.SAME_AS.items():
        assert claims[f"pretrained-{variant.replace('_', '-')}-within-rounding-float64"].implied_by == (
            f"pretrained-{parent.replace('_', '-')}-within-rounding-float64",)
    for cid, c in claims.items():
        if cid.endswith("-float32") and "within-rounding" in cid:
            assert c.kind == "implied" and c.implied_by == (cid.removesuffix("-float32") + "-float64",)
    assert macros["PretStripDiffFloatSixtyFour"] == 1e-7


def test_float32_claims_need_their_float64_twin():
    """Without the float64 rows (or with a float32 tolerance not measured against them) the float32
    claims would follow from nothing: the judge refuses them."""
    with pytest.raises(ValueError, match="no float64 rows"):
        _claims(_fake_changes(dtypes=("float32",)))
    analytic = _fake_changes()
    analytic.loc[analytic["dtype"] == "float32", "tolerance_kind"] = "analytic"
    with pytest.raises(ValueError, match="not measured against its float64 twin"):
        _claims(analytic)


def test_pretrained_claims_fail_on_missing_rows():
    with pytest.raises(ValueError, match="positive control"):
        _claims(_fake_changes().query("variant != 'random_query_bias_control'"))
    with pytest.raises(ValueError, match="strip_key_bias"):
        _claims(_fake_changes().query("variant != 'strip_key_bias'"))


@pytest.mark.claim_mutation(*CHANGE_IDS)
@pytest.mark.parametrize("variant", [v for v, _ in pretrained_judge.CHANGE_CLAIMS])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_change_claims_fail_when_the_change_exceeds_rounding(variant, dtype, record_mutation):
    changes = _fake_changes()
    sel = (changes["dtype"] == dtype) & (changes["variant"] == variant)
    changes.loc[sel, "max_abs_diff"] = 1e-4 * 1.01  # one percent past the tolerance
    claims, _ = _claims(changes)
    judged = [c for cid, c in claims.items() if cid in CHANGE_IDS
              and cid.startswith(f"pretrained-{variant.replace('_', '-')}-within-rounding-{dtype}")]
    assert len(judged) == 1
    record_mutation(*judged)
    changes.loc[sel, "max_abs_diff"] = float("nan")  # NaN never passes: it raises
    with pytest.raises(NonFiniteValues, match=f"{dtype} {variant}"):
        _claims(changes)


@pytest.mark.claim_mutation(pretrained_judge.PRETRAINED_CONTROL_DETECTED.id_for(dtype="float32"), pretrained_judge.PRETRAINED_CONTROL_DETECTED.id_for(dtype="float64"))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_control_claim_fails_without_power(dtype, record_mutation):
    changes = _fake_changes()
    sel = (changes["dtype"] == dtype) & (changes["variant"] == "random_query_bias_control")
    changes.loc[sel, "max_abs_diff"] = 1e-4 * 0.99  # one percent below the tolerance
    claims, _ = _claims(changes)
    record_mutation(claims[f"pretrained-control-detected-{dtype}"])


def test_the_bk_ratio_is_reported_not_claimed():
    """The ratio of b_k to b_q in the one fixed checkpoint is a measurement (a macro), not a claim."""
    claims, macros = _claims(_fake_changes(), NORMS.assign(bk_norm=[0.1, 2.0 * 1.01]))
    assert not any("smaller-than" in cid for cid in claims)
    assert macros["PretBkOverBqMax"] == pytest.approx(1.01)


@pytest.mark.claim_mutation(pretrained_judge.PRETRAINED_TOOL_EDITS_WITHIN_ROUNDING_FLOAT64.id_for(variant="strip-key-bias"))
def test_strip_claim_fails_for_a_surgery_that_changes_outputs(monkeypatch, record_mutation):
    """A real model and a broken surgery: 'strip' that also zeroes the query biases."""
    real = pretrained.surgery.strip_key_bias

    def broken(model, **kw):
        report = real(model, **kw)
        with torch.no_grad():
            for layer in model.encoder.layer:
                layer.attention.self.query.bias.zero_()
        return report

    monkeypatch.setattr(pretrained.surgery, "strip_key_bias", broken)
    changes, norms, info = pretrained.embedding_changes(pretrained.PretrainedConfig(
        n_sentences=4, batch_size=2, max_length=32, random_bias_scale=10.0, seed=0, noise_batch_size=3,
        dtypes=["float64"], num_threads=1))
    claims, _ = pretrained_judge.pretrained_claims(changes, norms, info, pretrained.reference_savings())
    by_id = {c.id: c for c in claims}
    record_mutation(by_id[pretrained_judge.PRETRAINED_TOOL_EDITS_WITHIN_ROUNDING_FLOAT64.id_for(variant="strip-key-bias")])
    assert _holds(by_id[pretrained_judge.PRETRAINED_ZERO_KEY_BIAS_WITHIN_ROUNDING_FLOAT64.id])


# ---------------------------------------------------------------------------- the family table

@pytest.fixture(scope="module")
def small_table():
    names = ["nn.MultiheadAttention", "BERT", "GPT-2", "LLaMA attention_bias", "MHA add_zero_attn"]
    return pretrained.family_table(0, names)


def test_family_table_and_claims_hold(small_table):
    t = small_table.set_index("family")
    assert t.loc["BERT", "strip"] == "removed" and t.loc["LLaMA attention_bias", "strip"] == "refused"
    assert "rotary" in t.loc["LLaMA attention_bias", "reason"]
    assert t.loc["GPT-2", "key_bias_removed"] == 2 * 16
    claims, macros = pretrained_judge.family_claims(small_table)
    assert all(_holds(c) for c in claims)
    assert macros["PretFamilies"] == 5 and macros["PretFamiliesWrong"] == 0
    assert "$b_k$ removed" in pretrained_show.family_table_latex(small_table)


@pytest.mark.claim_mutation(pretrained_judge.PRETRAINED_FAMILIES_HANDLED_UNCHANGED_FLOAT64.id)
def test_family_claim_fails_for_a_fold_that_forgets_w_o_b_v(monkeypatch, small_table, record_mutation):
    from keybias.studies.fixtures import families

    def forgetful(model, **kw):  # drops b_v without adding W_o b_v to b_o
        with torch.no_grad():
            for layer in model.encoder.layer:
                layer.attention.self.value.bias.zero_()
        return {"modules_changed": ["x"], "modules": [], "not_handled": [], "unchanged": []}

    monkeypatch.setattr(pretrained.surgery, "fold_value_bias", forgetful)
    model = families.build("BERT")
    args, kwargs = families.model_inputs("BERT", model)
    row = pretrained.family_row("BERT", model, args, kwargs, "handled", "mutated")
    table = pd.concat([small_table[small_table["family"] != "BERT"], pd.DataFrame([row])], ignore_index=True)
    claims = {c.id: c for c in pretrained_judge.family_claims(table)[0]}
    record_mutation(claims[pretrained_judge.PRETRAINED_FAMILIES_HANDLED_UNCHANGED_FLOAT64.id])


@pytest.mark.claim_mutation(pretrained_judge.PRETRAINED_FAMILIES_CONTROL_DETECTED.id)
def test_family_control_claim_fails_without_power(small_table, record_mutation):
    table = small_table.copy()
    bert = table["family"] == "BERT"
    table.loc[bert, "forced_change"] = table.loc[bert, "bound"] * 0.99  # one control 1% under the bound
    claims = {c.id: c for c in pretrained_judge.family_claims(table)[0]}
    record_mutation(claims[pretrained_judge.PRETRAINED_FAMILIES_CONTROL_DETECTED.id])


@pytest.mark.claim_mutation(pretrained_judge.PRETRAINED_FAMILIES_REFUSALS_NEEDED.id)
def test_refusal_claim_fails_when_a_refused_family_was_redundant(monkeypatch, small_table, record_mutation):
    """A tool that wrongly refuses BERT relative_key: zeroing its b_k by hand changes nothing."""
    from keybias.studies.fixtures import families

    def refuse(model, **kw):
        raise pretrained.surgery.SurgeryRefused("wrong", [{"reason": "wrongly refused"}], {})

    monkeypatch.setattr(pretrained.surgery, "strip_key_bias", refuse)
    model = families.build("BERT relative_key")
    args, kwargs = families.model_inputs("BERT relative_key", model)
    row = pretrained.family_row("BERT relative_key", model, args, kwargs, "refused", "mutated")
    table = pd.concat([small_table, pd.DataFrame([row])], ignore_index=True)
    claims = {c.id: c for c in pretrained_judge.family_claims(table)[0]}
    record_mutation(claims[pretrained_judge.PRETRAINED_FAMILIES_REFUSALS_NEEDED.id])


def test_family_claims_fail_on_empty_or_one_sided_tables(small_table):
    with pytest.raises(ValueError, match="empty"):
        pretrained_judge.family_claims(small_table.iloc[0:0])
    with pytest.raises(ValueError, match="handled and refused"):
        pretrained_judge.family_claims(small_table[small_table["expected"] == "handled"])


def test_bias_norm_outputs():
    norms = pd.DataFrame({"layer": [0, 1], "bq_norm": [1.0, 2.0], "bk_norm": [0.1, 0.2], "bv_norm": [1.0, 1.0],
                          "wk_fro_over_sqrt_din": [1.0, 1.0], "key_norm_median": [5.0, 6.0],
                          "bk_over_key_norm": [0.02, 0.03]})
    assert r"$\|b_k\|$" in pretrained_show.bias_norms_latex(norms)
    fig = pretrained_show.bias_norms_figure(norms)
    assert len(fig.axes[0].lines) == 3
    from keybias.studies import style

    assert style.smallest_font_pt(fig) >= style.MIN_FONT_PT
    assert fig.get_size_inches()[0] <= style.FULL_WIDTH


@pytest.mark.parametrize("profile", ["paper", "smoke"])
def test_profiles_set_every_parameter(profile):
    checked = params.load_profile(profile, ROOT / "params", ["05_pretrained"])["05_pretrained"]
    assert set(checked) == set(pretrained.PARAMETERS)
    if profile == "paper":
        assert checked["n_sentences"] >= 100


# ---------------------------------------------------------------- the table over all of transformers

ARCH_CLAIM = pretrained_judge.PRETRAINED_ARCHITECTURES_HANDLED_EXACT_REFUSALS_NEEDED.id


def _arch_table() -> pd.DataFrame:
    """A realistic table: two handled rows at float64 rounding, a needed refusal (RoPE), a
    refusal needed only at the module level, and rows that are not judged."""
    nan = float("nan")
    rows = [("bert", "removed exactly", "folded", 4e-16, 1.7e-7, nan, nan, nan),
            ("gpt2", "removed exactly", "folded", 4e-16, 1.9e-7, nan, nan, nan),
            ("qwen2", "refused", "refused: #", 0.0, 1.4e-7, 5e-2, 2.6e-3, 4.4e-9),
            ("led", "refused", "refused: #", 0.0, 1.5e-7, 7e-9, 1.4e-7, 6.9e-8),
            ("llama", "no key bias", "nothing to fold", 0.0, 1.7e-7, nan, nan, nan),
            ("segformer", "not certified", "folded", 4e-16, 1.7e-7, nan, nan, nan),
            ("luke", "could not build", "", nan, nan, nan, nan, nan)]
    return pd.DataFrame(rows, columns=["model_type", "status", "fold", "output_change", "output_bound",
                                       "naive_change", "naive_unit_change", "naive_unit_bound"]).assign(
        reason="", strip="")


def _arch_claim(table: pd.DataFrame):
    claims, _ = pretrained_judge.architecture_claims(table)
    return {c.id: c for c in claims}[ARCH_CLAIM]


def _arch_holds(table: pd.DataFrame) -> bool:
    return _holds(_arch_claim(table))


def test_architecture_claim_holds_and_counts_classes():
    table = _arch_table()
    assert _arch_holds(table)
    _, macros = pretrained_judge.architecture_claims(table)
    assert (macros["PretArchRemoved"], macros["PretArchRefused"], macros["PretArchNotCertified"],
            macros["PretArchNotBuilt"], macros["PretArchHandled"]) == (2, 2, 1, 1, 3)


@pytest.mark.claim_mutation(ARCH_CLAIM)
def test_architecture_claim_fails_for_one_handled_row_just_over_its_bound(record_mutation):
    table = _arch_table()
    table.loc[table["model_type"] == "gpt2", "output_change"] = 1.9e-7 * 1.01
    record_mutation(_arch_claim(table))
    table.loc[table["model_type"] == "gpt2", "output_change"] = float("nan")  # NaN never passes: it raises
    with pytest.raises(NonFiniteValues, match="output_change"):
        _arch_holds(table)


@pytest.mark.claim_mutation(ARCH_CLAIM)
def test_architecture_claim_fails_for_one_refusal_that_was_not_needed(record_mutation):
    table = _arch_table()
    led = table["model_type"] == "led"
    table.loc[led, "naive_unit_change"] = 6.9e-8 * 0.99  # both by-hand edits now below their bounds
    record_mutation(_arch_claim(table))


def test_architecture_claim_never_passes_on_nothing():
    with pytest.raises(ValueError):
        pretrained_judge.architecture_claims(_arch_table().iloc[0:0])
    with pytest.raises(ValueError):
        pretrained_judge.architecture_claims(_arch_table().query("status != 'removed exactly' and fold != 'folded'"))


def test_architecture_table_refuses_unknown_model_types_before_work():
    from keybias.studies.pretrained import architectures

    with pytest.raises(ValueError, match="unknown model types"):
        architectures.architecture_table(["bert", "no-such-model"])


def test_architecture_rows_of_common_families():
    from keybias.studies.pretrained import architectures

    table, _ = architectures.architecture_table(["bert", "qwen2"], workers=1)
    status = dict(zip(table["model_type"], table["status"], strict=True))
    assert status == {"bert": "removed exactly", "qwen2": "refused"}
    assert _arch_holds(table)
    assert set(table.columns) == set(__import__("keybias.studies.pretrained.schema", fromlist=["x"]).TABLES[
        "data/pretrained_architectures.csv"])


def test_certification_uses_the_models_own_kernel_and_replays_caches():
    """Attention sinks (ignored by the SDPA kernel) make the value fold inexact: it must be
    refused, not certified on SDPA. XLM passes a key/value cache that each call appends to:
    a replayed call must see the cache as it was, so its key bias is removed, not refused."""
    from keybias.studies.pretrained import architectures

    sinks = architectures.one_architecture("openai_privacy_filter")
    assert sinks["fold"].startswith("refused") and sinks["output_change"] <= sinks["output_bound"]
    cached = architectures.one_architecture("xlm")
    assert cached["status"] == "removed exactly" and cached["output_change"] <= cached["output_bound"]
