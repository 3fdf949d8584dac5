import pytest

from keybias import symbolic


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
    grid = symbolic.grid([1, 3], [2], [2])
    assert grid["nonzero_derivatives"].sum() == 0
    assert grid.set_index("n_keys").loc[3, "nonzero_query_bias_controls"] == 2
    assert grid.set_index("n_keys").loc[1, "nonzero_query_bias_controls"] == 0


def test_grid_rejects_bad_sizes():
    with pytest.raises(ValueError, match="grid_n"):
        symbolic.grid([0], [1], [1])


def test_counterexamples():
    c = symbolic.counterexamples()
    assert c["query_delta"] > 0.2 and c["value_delta"] == 1.0 and c["key_delta"] == 0.0


def test_fold_grid_is_exact_only_on_the_simplex():
    assert symbolic.fold_grid([1, 2, 3])["residual_zero"].all()


def test_jacobian_ones_grid():
    assert symbolic.jacobian_ones_grid([1, 2, 4])["jacobian_ones_zero"].all()


def test_score_split_finds_the_shift_itself():
    split = symbolic.key_bias_enters_as_shift()
    assert split["holds"] and split["shift"] != 0
