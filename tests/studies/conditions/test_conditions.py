"""keybias.studies.conditions.measure: each case's prediction holds, and each claim fails on data or a model that
violates it."""

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from keybias.core.reduce import NonFiniteValues
from keybias.pipeline import claims as C
from keybias.studies import style
from keybias.studies.conditions import judge as conditions_judge
from keybias.studies.conditions import measure as conditions
from keybias.studies.conditions import show as conditions_show
from keybias.studies.conditions.cases import CASE_BY_KEY, CASES, REDUNDANT, claim_id
from keybias.studies.fixtures import reference as R

ROOT = Path(__file__).resolve().parents[3]

SIZES = dict(embed_dim=8, num_heads=2, seq_len=4, batch=1)
KNOBS = dict(softcap=5.0, weight_decay=0.01, regulariser=0.01, dropout=0.3)
CFG = conditions.ConditionsConfig(**SIZES, **KNOBS, seeds=[0])
ALL_CASE_IDS = [claim_id(c) for c in CASES]
TEST_CASES = [c for c in CASES if c.kind == "test"]
TEST_CASE_IDS = [claim_id(c) for c in TEST_CASES]
# the cases whose outcome the code itself guarantees (see BY_CONSTRUCTION)
BY_CONSTRUCTION_IDS = {
    "cond-loss-l2-on-bk", "cond-optimizer-adam-coupled-wd", "cond-fold-fully-masked-row",
    "cond-fold-attention-dropout", "cond-fold-add-zero-attn", "cond-fold-output-gate",
}
QUIRK_IDS = [
    conditions_judge.COND_QUIRK_NEED_WEIGHTS_CHANGES_OUTPUT.id_for(option="add-bias-kv"),
    conditions_judge.COND_QUIRK_NEED_WEIGHTS_TRUE_DOCUMENTED.id_for(option="add-bias-kv"),
    conditions_judge.COND_QUIRK_NEED_WEIGHTS_CHANGES_OUTPUT.id_for(option="add-zero-attn"),
    conditions_judge.COND_QUIRK_NEED_WEIGHTS_TRUE_DOCUMENTED.id_for(option="add-zero-attn"),
    conditions_judge.COND_QUIRK_PLAIN_PATHS_AGREE.id,
]


def holds(claims, tmp_path=None) -> dict[str, bool]:
    """Judge claims exactly as the notebook's Recorder does (`holds` is computed, not typed)."""
    return {cid: r["holds"] for cid, r in C.evaluate(claims).items()}


def judged(claims) -> dict[str, dict]:
    return C.evaluate(claims)


@pytest.fixture(scope="module")
def frame():
    return conditions.measure(CFG.replace(seeds=[0, 1]))


def case(condition, variant):
    return CASE_BY_KEY[(condition, variant)]


def test_every_prediction_holds_on_clean_data(frame, tmp_path):
    result = holds(conditions_judge.judge(frame), tmp_path)
    assert set(result) == set(ALL_CASE_IDS)
    assert all(result.values()), [k for k, v in result.items() if not v]
    summary = conditions_judge.summary(frame)
    assert (summary["verdict"] == summary["predicted"]).all()


def test_each_case_has_a_measurement_and_unique_id():
    assert len(set(ALL_CASE_IDS)) == len(CASES)
    w = conditions._weights(0, **SIZES)
    for c in CASES:
        assert math.isfinite(conditions.measure_case(c, w, CFG))


def test_cases_are_proof_checks_of_the_own_attention_or_consistency_checks():
    """Every case evaluates the project's own float64 attention, so it is a proof check (its
    identity is its statement); the cases whose outcome the code puts there are consistency
    checks. Only the size of the PyTorch quirk, which runs PyTorch's module, is a test."""
    kinds = {claim_id(c): c.kind for c in CASES}
    assert {cid for cid, kind in kinds.items() if kind != "proof"} == BY_CONSTRUCTION_IDS
    assert set(kinds.values()) == {"proof", "consistency"}
    claims = {c.id: c for c in conditions_judge.judge(conditions.measure(CFG))}
    assert all(c.identity == case.statement for case in CASES for c in [claims[claim_id(case)]]
               if case.kind == "proof")


def _at_the_edge(frame, c, factor=1.1):
    """`frame` with seed 1 of case `c` moved just past its bound (by `factor`): the smallest
    violation, judged through the notebook's own worst-seed reduction."""
    bound, comparison, _ = conditions_judge.bounds_for(c)
    doctored = frame.copy()
    row = doctored.index[(doctored["variant"] == c.variant) & (doctored["seed"] == 1)][0]
    doctored.loc[row, "effect"] = bound * factor if comparison == "<=" else bound / factor
    return doctored


@pytest.mark.claim_mutation(*TEST_CASE_IDS)
def test_one_seed_just_past_the_bound_fails_the_claim(frame, record_mutation):
    """The worst seed decides, at the edge: one seed 10% past its bound among good ones fails."""
    for c in TEST_CASES:
        record_mutation(*judged(conditions_judge.judge(_at_the_edge(frame, c), [c])).values())


def test_edge_values_inside_the_bound_still_hold(frame):
    """The converse: a seed 10% inside its bound leaves the claim holding (the edge is the bound)."""
    for c in TEST_CASES:
        assert holds(conditions_judge.judge(_at_the_edge(frame, c, factor=1 / 1.1), [c])) == {claim_id(c): True}


@pytest.mark.claim_mutation(*[claim_id(c) for c in TEST_CASES if c.predicted == REDUNDANT])
def test_sigmoid_instead_of_softmax_breaks_the_redundant_cases(monkeypatch, record_mutation):
    """A model that violates the premise: sigmoid weights ignore no shift and do not sum to one,
    so every redundant case and the plain fold must fail."""
    monkeypatch.setattr(conditions.torch, "softmax", lambda s, dim: torch.sigmoid(s))
    redundant = [c for c in TEST_CASES if c.predicted == REDUNDANT]
    mutated = conditions.measure(CFG, cases=redundant)
    record_mutation(*judged(conditions_judge.judge(mutated, redundant)).values())


def test_no_regulariser_leaves_no_gradient(tmp_path):
    c = case("loss", "l2-on-bk")
    mutated = conditions.measure(CFG.replace(regulariser=1e-300), cases=[c])
    assert holds(conditions_judge.judge(mutated, [c]), tmp_path) == {claim_id(c): False}


def test_decoupled_or_no_decay_leaves_bk_in_place(tmp_path):
    c = case("optimizer", "adam-coupled-wd")
    w = conditions._weights(0, **SIZES)
    still = conditions._adam_step(w, weight_decay=0.0)
    frame = pd.DataFrame([{"condition": c.condition, "variant": c.variant, "quantity": c.quantity,
                           "predicted": c.predicted, "seed": 0, "effect": still}])
    assert holds(conditions_judge.judge(frame, [c]), tmp_path) == {claim_id(c): False}


@pytest.mark.claim_mutation("cond-scores-softcap")
def test_a_cap_far_above_the_scores_is_linear(record_mutation):
    """Near the smallest cap at which the claim fails: the effect falls as 1/cap^2 and crosses
    BREAK_MIN near cap 1200 on these sizes; at 1500 it is about 0.7 BREAK_MIN."""
    c = case("scores", "softcap")
    mutated = conditions.measure(CFG.replace(softcap=1500.0), cases=[c])
    record_mutation(*judged(conditions_judge.judge(mutated, [c])).values())


def test_fold_with_dropout_off_is_exact(tmp_path):
    c = case("fold", "attention-dropout")
    mutated = conditions.measure(CFG.replace(dropout=1e-300), cases=[c])
    assert holds(conditions_judge.judge(mutated, [c]), tmp_path) == {claim_id(c): False}


def test_non_finite_or_missing_effects_fail(frame, tmp_path):
    doctored = frame.copy()
    doctored.loc[doctored.index[0], "effect"] = float("nan")
    first = CASES[0]
    with pytest.raises(NonFiniteValues):  # NaN never passes: it raises (keybias.core.reduce)
        conditions_judge.judge(doctored, [first])
    empty = frame[frame["variant"] != first.variant]
    assert holds(conditions_judge.judge(empty, [first]), tmp_path / "empty") == {claim_id(first): False}
    assert conditions_judge.summary(empty, [first])["verdict"].iloc[0] == "undecided"


def test_partial_rope_dims_split_each_head():
    w = conditions._weights(0, **SIZES)
    rotated = conditions._head_dims(w, rotated=True)
    unrotated = conditions._head_dims(w, rotated=False)
    assert sorted(rotated + unrotated) == list(range(SIZES["embed_dim"]))
    assert rotated == [0, 1, 4, 5]


def test_rotation_is_identity_at_position_zero_and_keeps_norms():
    t = torch.randn(1, 1, 5, 8, dtype=torch.float64)
    r = R.rope_half(t, 4)
    assert torch.equal(r[..., 0, :], t[..., 0, :])
    assert torch.equal(r[..., 4:], t[..., 4:])
    assert torch.allclose(r[..., :4].norm(dim=-1), t[..., :4].norm(dim=-1))


def test_explicit_attention_matches_torch_mha():
    """The explicit layer is plain nn.MultiheadAttention when no switch is on."""
    w = conditions._weights(3, **SIZES)
    E, H = SIZES["embed_dim"], SIZES["num_heads"]
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([w["w_q"], w["w_k"], w["w_v"]]))
        mha.in_proj_bias.copy_(torch.cat([w["b_q"], w["b_k"], w["b_v"]]))
        mha.out_proj.weight.copy_(w["w_o"])
        mha.out_proj.bias.copy_(w["b_o"])
        expected = mha(w["x"], w["x"], w["x"], need_weights=False)[0]
    assert torch.allclose(conditions.attention(w), expected, atol=1e-12)


@pytest.mark.parametrize("sizes, message", [
    (dict(embed_dim=12, num_heads=2, seq_len=4, batch=1), "multiple of 4"),
    (dict(embed_dim=8, num_heads=3, seq_len=4, batch=1), "not divisible"),
    (dict(embed_dim=8, num_heads=1, seq_len=4, batch=1), "at least 2"),
])
def test_bad_sizes_are_refused_before_work(sizes, message):
    with pytest.raises(ValueError, match=message):
        conditions.ConditionsConfig(**sizes, **KNOBS)


def test_profiles_validate():
    from keybias.studies.params import load_profile

    for profile in ("smoke", "paper"):
        params = load_profile(profile, ROOT / "params", ["07_conditions"])["07_conditions"]
        assert conditions.ConditionsConfig.from_mapping(params).as_dict() == params
    smoke = load_profile("smoke", ROOT / "params", ["07_conditions"])["07_conditions"]
    assert conditions.ConditionsConfig().as_dict() == smoke


def test_config_fields_are_the_parameters_and_misspellings_name_the_nearest():
    import dataclasses

    from keybias.studies.params import ParameterError

    assert {f.name for f in dataclasses.fields(conditions.ConditionsConfig)} == set(conditions.PARAMETERS)
    with pytest.raises(ParameterError, match="did you mean 'regulariser'"):
        conditions.ConditionsConfig.from_mapping({"regularizer": 0.1})
    with pytest.raises(ParameterError, match="seeds"):
        conditions.ConditionsConfig(seeds=[])
    quirk_ids = {i for _, *ids in conditions_judge.QUIRK_CLAIM_IDS for i in ids} | {conditions_judge.COND_QUIRK_PLAIN_PATHS_AGREE.id}
    assert quirk_ids == set(QUIRK_IDS)


def quirk_rows(**overrides):
    base = {
        "plain": (0.0, 0.0, 0.0),
        "add_bias_kv": (0.3, 0.3, 0.0),
        "add_zero_attn": (0.2, 0.2, 0.0),
    }
    base.update(overrides)
    return pd.DataFrame([
        {"option": k, "torch": "x", "max_abs_diff_need_weights": a,
         "max_abs_diff_false_vs_reference": b, "max_abs_diff_true_vs_reference": c}
        for k, (a, b, c) in base.items()
    ])


def test_quirk_judge_accepts_the_reported_pattern(tmp_path):
    result = holds(conditions_judge.judge_quirk(quirk_rows()), tmp_path)
    assert set(result) == set(QUIRK_IDS) and all(result.values())


def test_the_quirk_is_decided_by_the_size_of_the_change_and_the_documented_checks_are_consistency():
    """The finding rests on a measurement of PyTorch: the size of the output change, against the
    theory bound BREAK_MIN. The checks that need_weights=True and the plain paths do what the
    documentation says restate it against the reproducer's reference: consistency checks."""
    from keybias.core.claimspec import spec_of
    from keybias.studies import findings

    changes = {conditions_judge.COND_QUIRK_NEED_WEIGHTS_CHANGES_OUTPUT.id_for(option=o)
               for o in ("add-bias-kv", "add-zero-attn")}
    kinds = {cid: spec_of(cid).kind for cid in QUIRK_IDS}
    assert {cid for cid, kind in kinds.items() if kind == "test"} == changes
    assert {kinds[cid] for cid in set(QUIRK_IDS) - changes} == {"consistency"}
    quirk = next(f for f in findings.list_findings() if f.id == "need-weights-quirk")
    assert set(quirk.decided_by) == changes and set(quirk.rests_on) == set(QUIRK_IDS) - changes
    assert all(c.bound == conditions_judge.BREAK_MIN for c in conditions_judge.judge_quirk(quirk_rows())
               if c.id in changes)


@pytest.mark.claim_mutation(*QUIRK_IDS)
def test_quirk_claims_fail_at_the_edge_of_their_bounds(record_mutation):
    """A PyTorch whose paths differ by just under BREAK_MIN (the tests), or agree only to 1.1x
    REDUNDANT_MAX (the documented-behaviour checks)."""
    edge = conditions_judge.BREAK_MIN / 1.1
    fixed = quirk_rows(add_bias_kv=(edge, edge, 0.0), add_zero_attn=(edge, edge, 0.0))
    result = judged(conditions_judge.judge_quirk(fixed))
    record_mutation(result[conditions_judge.COND_QUIRK_NEED_WEIGHTS_CHANGES_OUTPUT.id_for(option="add-bias-kv")],
                    result[conditions_judge.COND_QUIRK_NEED_WEIGHTS_CHANGES_OUTPUT.id_for(option="add-zero-attn")])
    off = conditions_judge.REDUNDANT_MAX * 1.1
    wrong = quirk_rows(plain=(off, off, off), add_bias_kv=(0.3, 0.0, off), add_zero_attn=(0.2, 0.0, off))
    result = judged(conditions_judge.judge_quirk(wrong))
    record_mutation(result[conditions_judge.COND_QUIRK_NEED_WEIGHTS_TRUE_DOCUMENTED.id_for(option="add-bias-kv")],
                    result[conditions_judge.COND_QUIRK_NEED_WEIGHTS_TRUE_DOCUMENTED.id_for(option="add-zero-attn")],
                    result[conditions_judge.COND_QUIRK_PLAIN_PATHS_AGREE.id])


def test_quirk_claims_fail_when_pytorch_behaves_otherwise(tmp_path):
    fixed = quirk_rows(add_bias_kv=(0.0, 0.0, 0.0), add_zero_attn=(0.0, 0.0, 0.0))
    result = holds(conditions_judge.judge_quirk(fixed), tmp_path / "fixed")
    assert not result[conditions_judge.COND_QUIRK_NEED_WEIGHTS_CHANGES_OUTPUT.id_for(option="add-bias-kv")]
    assert not result[conditions_judge.COND_QUIRK_NEED_WEIGHTS_CHANGES_OUTPUT.id_for(option="add-zero-attn")]
    wrong = quirk_rows(plain=(0.1, 0.1, 0.1), add_bias_kv=(0.3, 0.0, 0.3), add_zero_attn=(0.2, 0.0, 0.2))
    result = holds(conditions_judge.judge_quirk(wrong), tmp_path / "wrong")
    assert not result[conditions_judge.COND_QUIRK_NEED_WEIGHTS_TRUE_DOCUMENTED.id_for(option="add-bias-kv")]
    assert not result[conditions_judge.COND_QUIRK_NEED_WEIGHTS_TRUE_DOCUMENTED.id_for(option="add-zero-attn")]
    assert not result[conditions_judge.COND_QUIRK_PLAIN_PATHS_AGREE.id]
    missing = quirk_rows().iloc[1:]
    assert not holds(conditions_judge.judge_quirk(missing), tmp_path / "missing")[conditions_judge.COND_QUIRK_PLAIN_PATHS_AGREE.id]


def test_the_reproducer_script_runs_standalone(tmp_path):
    rows = conditions.run_quirk_script()
    assert set(rows["option"]) == {"plain", "add_bias_kv", "add_zero_attn"}
    result = holds(conditions_judge.judge_quirk(rows), tmp_path)
    assert all(result.values()), result


def test_reproducer_missing_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="reproducer"):
        conditions.run_quirk_script(tmp_path / "nope.py")


def test_figure_is_readable_and_table_has_verdicts(frame):
    summary = conditions_judge.summary(frame)
    fig = conditions_show.effect_figure(summary)
    assert style.smallest_font_pt(fig) >= style.MIN_FONT_PT
    assert fig.get_size_inches()[0] == pytest.approx(style.FULL_WIDTH)
    table = conditions_show.table_latex(summary)
    assert table.count(r"\\") == len(CASES) + 1 and "not redundant" in table


def test_explicit_grouped_query_attention_matches_sdpa():
    """The explicit GQA/MQA path (key heads repeated) is what SDPA's enable_gqa computes."""
    w = conditions._weights(4, **SIZES)
    E, H = SIZES["embed_dim"], SIZES["num_heads"]
    d, G = E // H, 1
    q = R.split_heads(w["x"] @ w["w_q"].T + w["b_q"], H)
    k = R.split_heads(w["x"] @ w["w_k"][: G * d].T + w["b_k"][: G * d], G)
    v = R.split_heads(w["x"] @ w["w_v"][: G * d].T + w["b_v"][: G * d], G)
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    expected = R.merge_heads(o) @ w["w_o"].T + w["b_o"]
    assert torch.allclose(conditions.attention(w, kv_heads=G), expected, atol=1e-12)


def test_fully_masked_row_gives_the_output_bias_and_other_rows_are_untouched():
    w = conditions._weights(5, **SIZES)
    masked = conditions.attention(w, masked_row=True)
    plain = conditions.attention(w)
    assert torch.allclose(masked[:, 0], w["b_o"].expand_as(masked[:, 0]))
    assert torch.allclose(masked[:, 1:], plain[:, 1:], rtol=0, atol=1e-14)
