import pandas as pd
import pytest

from keybias.pipeline import claims
from keybias.studies.symbolic import derive as symbolic
from keybias.studies.symbolic import judge as symbolic_judge


def test_softmax_is_shift_invariant_and_sigmoid_is_not():
    assert symbolic.shift_invariance()["holds"]
    assert not symbolic.shift_invariance("sigmoid")["holds"]
    with pytest.raises(ValueError, match="allowed"):
        symbolic.shift_invariance("relu")


def test_general_results_hold():
    assert symbolic.key_bias_enters_as_shift()["holds"]
    assert symbolic.zero_gradient()["holds"]
    assert symbolic.value_bias_fold()["holds"]


def test_vanishes_detects_zero_and_nonzero():
    outputs, bk, bq, bv = symbolic.attention_output(n=3, d=2)
    assert symbolic.vanishes(symbolic.sp.diff(outputs[0], bk[0]))
    assert not symbolic.vanishes(symbolic.sp.diff(outputs[0], bq[0]))
    assert not symbolic.vanishes(symbolic.sp.diff(outputs[0], bv[0]))


def test_grid_sees_key_bias_zero_and_query_bias_control():
    grid = symbolic.grid(symbolic.SymbolicConfig(grid_n=[1, 3], grid_d=[2], grid_heads=[2]))
    assert grid["nonzero_derivatives"].sum() == 0
    assert grid.set_index("n_keys").loc[3, "nonzero_query_bias_controls"] == 2
    assert grid.set_index("n_keys").loc[1, "nonzero_query_bias_controls"] == 0


def test_grid_rejects_bad_sizes():
    with pytest.raises(ValueError, match="grid_n"):
        symbolic.SymbolicConfig(grid_n=[0])


def test_counterexamples():
    c = symbolic.counterexamples()
    assert c["query_delta"] > 0.1 and c["value_delta"] == 1.0 and c["key_delta"] == 0.0


def test_fold_grid_is_exact_only_on_the_simplex():
    assert symbolic.fold_grid([1, 2, 3])["residual_zero"].all()


def test_jacobian_ones_grid():
    assert symbolic.jacobian_ones_grid([1, 2, 4])["jacobian_ones_zero"].all()


def test_score_split_finds_the_shift_itself():
    split = symbolic.key_bias_enters_as_shift()
    assert split["holds"] and split["shift"] != 0


def test_single_key_makes_the_query_bias_control_vanish_too():
    """Softmax of one score is 1: with a single key no bias in the scores can matter."""
    row = symbolic.grid_check(1, 2, 2)
    assert row["nonzero_query_bias_controls"] == 0 and row["nonzero_derivatives"] == 0


# ----------------------------------------------------------------------------- claims and mutations
def _results(model="mha", kind="softmax", split_model="mha", normalised=True, ns=(1, 2), ds=(1,), heads=(1, 2)):
    """Every input of `symbolic_claims`, computed on the given (possibly mutated) model."""
    return dict(
        split=symbolic.key_bias_enters_as_shift(split_model),
        shift=symbolic.shift_invariance(kind),
        grad=symbolic.zero_gradient(kind),
        jacobian=symbolic.jacobian_ones_grid(list(ns), kind),
        grid_rows=symbolic.grid(symbolic.SymbolicConfig(grid_n=ns, grid_d=ds, grid_heads=heads), model),
        counter=symbolic.counterexamples(model),
        fold=symbolic.value_bias_fold(normalised),
        folds=symbolic.fold_grid(list(ns), normalised),
    )


def _judged(**results) -> dict[str, dict]:
    """{claim id: record} of the claims judged on `results` (records `record_mutation` accepts)."""
    return claims.evaluate(symbolic.symbolic_claims(**results))


def _holds(**results) -> dict[str, bool]:
    return {cid: r["holds"] for cid, r in _judged(**results).items()}


@pytest.fixture(scope="module")
def mha_holds():
    return _holds(**_results())


def test_every_claim_holds_for_multihead_attention(mha_holds):
    assert all(mha_holds.values()), mha_holds
    kinds = {c.id: c.kind for c in symbolic.symbolic_claims(**_results(ns=(2,), heads=(1,)))}
    assert kinds[symbolic_judge.SYMBOLIC_JACOBIAN_ONES_GRID.id] == kinds[symbolic_judge.SYMBOLIC_VALUE_BIAS_FOLD_GRID.id] == "consistency"
    assert {k for cid, k in kinds.items() if "grid" not in cid or "zero-deriv" in cid or "control" in cid} == {"proof"}


def test_exact_derivations_are_proof_checks_that_name_their_identity():
    """SymPy checks identities: no claim of notebook 01 is an empirical test."""
    made = symbolic.symbolic_claims(**_results(ns=(2,), heads=(1,)))
    assert not [c.id for c in made if c.kind == "test"]
    for c in made:
        assert (c.kind == "proof") == bool(c.identity), c.id


@pytest.mark.claim_mutation(symbolic_judge.SYMBOLIC_SCORE_SPLIT.id)
def test_split_fails_for_a_per_key_bias(mha_holds, record_mutation):
    judged = _judged(**_results(split_model="per_key_bias"))
    assert mha_holds[symbolic_judge.SYMBOLIC_SCORE_SPLIT.id]
    record_mutation(judged[symbolic_judge.SYMBOLIC_SCORE_SPLIT.id])


@pytest.mark.claim_mutation(symbolic_judge.SYMBOLIC_SOFTMAX_SHIFT_INVARIANCE.id, symbolic_judge.SYMBOLIC_ZERO_GRADIENT.id)
def test_shift_and_gradient_claims_fail_for_sigmoid_weights(record_mutation):
    judged = _judged(**_results(kind="sigmoid"))
    record_mutation(judged[symbolic_judge.SYMBOLIC_SOFTMAX_SHIFT_INVARIANCE.id], judged[symbolic_judge.SYMBOLIC_ZERO_GRADIENT.id])
    assert not judged[symbolic_judge.SYMBOLIC_JACOBIAN_ONES_GRID.id]["holds"]


@pytest.mark.claim_mutation(symbolic_judge.SYMBOLIC_GRID_ZERO_DERIVATIVES.id, symbolic_judge.SYMBOLIC_KEY_BIAS_EXAMPLE.id)
@pytest.mark.parametrize("model", ["extra_key_slot", "per_key_bias"])
def test_key_bias_claims_fail_when_a_slot_escapes_the_shift(model, record_mutation):
    judged = _judged(**_results(model=model))
    record_mutation(judged[symbolic_judge.SYMBOLIC_GRID_ZERO_DERIVATIVES.id], judged[symbolic_judge.SYMBOLIC_KEY_BIAS_EXAMPLE.id])


@pytest.mark.claim_mutation(symbolic_judge.SYMBOLIC_GRID_QUERY_BIAS_CONTROL.id, symbolic_judge.SYMBOLIC_QUERY_BIAS_MATTERS.id)
def test_query_bias_claims_fail_without_a_query_bias(record_mutation):
    judged = _judged(**_results(model="no_query_bias"))
    record_mutation(judged[symbolic_judge.SYMBOLIC_GRID_QUERY_BIAS_CONTROL.id], judged[symbolic_judge.SYMBOLIC_QUERY_BIAS_MATTERS.id])


@pytest.mark.claim_mutation(symbolic_judge.SYMBOLIC_GRID_QUERY_BIAS_CONTROL.id)
def test_query_bias_control_fails_on_single_key_grids_only(record_mutation):
    """Single-key sizes carry no evidence: a grid of only those is an empty selection, which fails."""
    record_mutation(_judged(**_results(ns=(1,)))[symbolic_judge.SYMBOLIC_GRID_QUERY_BIAS_CONTROL.id])


@pytest.mark.claim_mutation(symbolic_judge.SYMBOLIC_VALUE_BIAS_MATTERS.id)
def test_value_bias_claim_fails_without_a_value_bias(record_mutation):
    record_mutation(_judged(**_results(model="no_value_bias"))[symbolic_judge.SYMBOLIC_VALUE_BIAS_MATTERS.id])


@pytest.mark.claim_mutation(symbolic_judge.SYMBOLIC_VALUE_BIAS_FOLD.id)
def test_fold_claims_fail_when_weights_do_not_sum_to_one(record_mutation):
    judged = _judged(**_results(normalised=False))
    record_mutation(judged[symbolic_judge.SYMBOLIC_VALUE_BIAS_FOLD.id])
    assert not judged[symbolic_judge.SYMBOLIC_VALUE_BIAS_FOLD_GRID.id]["holds"]


def test_empty_grids_fail_the_grid_claims():
    empty = pd.DataFrame()
    results = _results(ns=(2,), heads=(1,))
    holds = _holds(**{**results, "grid_rows": empty, "jacobian": empty, "folds": empty})
    for cid in (symbolic_judge.SYMBOLIC_GRID_ZERO_DERIVATIVES.id, symbolic_judge.SYMBOLIC_JACOBIAN_ONES_GRID.id, symbolic_judge.SYMBOLIC_VALUE_BIAS_FOLD_GRID.id,
                symbolic_judge.SYMBOLIC_GRID_QUERY_BIAS_CONTROL.id):
        assert not holds[cid], cid


def test_unknown_model_is_rejected():
    with pytest.raises(ValueError, match="allowed"):
        symbolic.attention_output(2, 1, model="rope")


def test_config_defaults_are_the_smoke_profile_and_fields_are_the_parameters():
    import dataclasses
    from pathlib import Path

    from keybias.studies import params

    root = Path(__file__).resolve().parents[3] / "params"
    assert {f.name for f in dataclasses.fields(symbolic.SymbolicConfig)} == set(symbolic.PARAMETERS)
    smoke = params.load_profile("smoke", root, ["01_symbolic"])["01_symbolic"]
    assert symbolic.SymbolicConfig().as_dict() == smoke
    paper = params.load_profile("paper", root, ["01_symbolic"])["01_symbolic"]
    assert symbolic.SymbolicConfig.from_mapping(paper).as_dict() == paper


def test_config_rejects_misspelled_and_bad_values_naming_them():
    from keybias.studies.params import ParameterError

    with pytest.raises(ParameterError, match="did you mean 'grid_heads'"):
        symbolic.SymbolicConfig.from_mapping({"grid_head": [1]})
    with pytest.raises(ParameterError, match="grid_d"):
        symbolic.SymbolicConfig(grid_d=[7])
    assert symbolic.SymbolicConfig(grid_n=[3]).grid_n == (3,)
