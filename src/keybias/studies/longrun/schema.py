"""Columns of the longrun study's data tables and the output class of each.

Every column of every `results/data/*.csv` this study writes is declared here once: `exact`,
`machine`, or the name of a tolerance in `keybias.pipeline.outputs.TOLERANCES`. `make verify` and
the column test read these declarations; a column written but not declared fails a test.

The `longrun_full_*` tables are computed from the recorded grid (`recorded/longrun-cpu/`), files
every build reads unchanged: their numbers move between machines only by the last bits of a
float64 fit (`f64`), whatever the runs' own chaos was when they were recorded.
"""

from keybias.studies.columns import cols

# data/<file>.csv -> column -> class
TABLES: dict[str, dict[str, str]] = {
    "data/longrun_trajectory.csv": cols(
        exact="role dtype eps seed step layer lr n_bias",
        walk_long="norm_b_k drift_b_k grad_rms_b_k noise_sum grad_mean_rms_b_k grad_along_drift",
        loss="loss",
    ),
    "data/longrun_grid.csv": cols(
        exact="role dtype eps seed step layer lr n_bias",
        walk="norm_b_k drift_b_k grad_rms_b_k noise_sum grad_mean_rms_b_k grad_along_drift",
        loss="loss",
    ),
    "data/longrun_probes.csv": cols(
        exact="role dtype eps seed step layer",
        walk_long="norm_b_k output_change_rms predicted_bias_rms cos_b_k_mean_query",
        statistic="key_norm predicted_change_rms query_norm",
    ),
    "data/longrun_grid_probes.csv": cols(
        exact="role dtype eps seed step layer",
        walk="norm_b_k output_change_rms predicted_bias_rms cos_b_k_mean_query",
        statistic="key_norm predicted_change_rms query_norm",
    ),
    "data/longrun_prediction.csv": cols(
        exact="layer step grid_steps",
        statistic="noise_sum noise_rate predicted_drift",
    ),
    "data/longrun_entries.csv": cols(
        exact="role dtype eps seed step layer entry",
        walk="displacement",
    ),
    "data/longrun_exponent.csv": cols(
        exact="layer steps window_start window_points entries",
        exponent="exponent exponent_low exponent_high",
    ),
    "data/longrun_full_units.csv": cols(
        exact="size dtype eps seed layer steps window_start window_points n_bias short_step",
        f64=("exponent step_rate noise_elasticity grad_rms_late grad_along_drift grad_along_drift_se "
             "velocity_measured velocity_predicted drift_end drift_at_short key_norm_end bk_over_key_end "
             "cos_mean_query cos_mean_query_sqrt_n"),
    ),
    "data/longrun_full_null.csv": cols(
        exact="size dtype eps seed layer walks",
        f64="velocity_measured null_velocity_measured speedup_over_null null_match_fraction",
    ),
    "data/longrun_full_intervals.csv": cols(
        exact="size dtype eps seeds column",
        f64="mean low high min max",
    ),
}


# results/macros/08_longrun.tex: every macro this study writes there, by name -> its class
# (as for columns).
# `{axis}` stands for each value of that axis (keybias.pipeline.macro_classes.AXES, or
# MACRO_AXES below); `make verify` expands the templates and looks each name up exactly.
MACRO_FILE = "macros/08_longrun.tex"
MACROS: dict[str, str] = cols(
    exact=(
        "LongBatch LongContext LongCorpusBytes LongCorpusFiles LongCorpusPackage LongCorpusShort "
        "LongDriftVerdict LongDtype LongEmbedDim LongEps LongExponentSeparating LongExponentWindowStart "
        "LongGridSeeds LongGridSettings LongGridSteps LongHeads LongLayers LongLr LongParams "
        "LongPredictionFactorBound LongSeed LongSteps LongWeightDecay"
    ),
    exponent="LongExponent LongExponentHigh LongExponentLow LongExponentSeparation LongLawExponent",
    f64=(
        "LongFullBatch LongFullBiasMinSe LongFullBiasSmall LongFullBkOverKeyMax LongFullBkOverKeyMedian "
        "LongFullCommit LongFullContext LongFullControlMedian LongFullControlMin LongFullCpu "
        "LongFullDampingMax LongFullDampingMedian LongFullElasticityOutsideMax "
        "LongFullElasticityOutsideMin LongFullExponentMedianSmall LongFullExponentMediumBfloatEpsEight "
        "LongFullExponentMediumBfloatEpsEightHigh LongFullExponentMediumBfloatEpsEightLow "
        "LongFullExponentMediumFloatEpsEight LongFullExponentMediumFloatEpsEightHigh "
        "LongFullExponentMediumFloatEpsEightLow LongFullExponentMediumFloatEpsTwelve "
        "LongFullExponentMediumFloatEpsTwelveHigh LongFullExponentMediumFloatEpsTwelveLow "
        "LongFullExponentSmallBfloatEpsEight LongFullExponentSmallBfloatEpsEightHigh "
        "LongFullExponentSmallBfloatEpsEightLow LongFullExponentSmallFloatEpsEight "
        "LongFullExponentSmallFloatEpsEightHigh LongFullExponentSmallFloatEpsEightLow "
        "LongFullExponentSmallFloatEpsTwelve LongFullExponentSmallFloatEpsTwelveHigh "
        "LongFullExponentSmallFloatEpsTwelveLow LongFullLr LongFullMechanismRuns LongFullMinutes "
        "LongFullNullMatchFraction LongFullNullPassFraction LongFullNullSpeedupMax LongFullNullSpeedupMedian "
        "LongFullNullSpeedupMin LongFullNullWalks "
        "LongFullNoiseElasticity LongFullNoiseElasticityHigh LongFullNoiseElasticityMediumMin LongFullNoiseElasticityMediumMax "
        "LongFullQueryCos LongFullQueryCosMedium "
        "LongFullQueryCosSqrtN LongFullQueryCosSqrtNDamped LongFullNoiseKeyNormElasticityMax LongFullRateBfloatEpsEightMedian LongFullRateBfloatEpsEightMin "
        "LongFullRateFloatEpsEightMax LongFullRateFloatEpsEightMedian LongFullRateFloatEpsTwelveMedian "
        "LongFullRateFloatEpsTwelveMin LongFullRunExponentBfloatEpsEightMax "
        "LongFullRunExponentBfloatEpsEightMin LongFullRunExponentFloatEpsEightMax "
        "LongFullRunExponentFloatEpsEightMin LongFullRunExponentFloatEpsTwelveMax "
        "LongFullRunExponentFloatEpsTwelveMin LongFullRunRateBfloatEpsEightMax "
        "LongFullRunRateBfloatEpsEightMin LongFullRunRateFloatEpsEightMax LongFullRunRateFloatEpsEightMin "
        "LongFullRunRateFloatEpsTwelveMax LongFullRunRateFloatEpsTwelveMin LongFullRuns LongFullSeeds "
        "LongFullSizes LongFullStepsBfloat LongFullStepsMedium LongFullStepsSmall LongFullTorch "
        "LongFullVelocityOutsideRatioMax LongFullVelocityOutsideRatioMin LongFullVelocityOutsideRows "
        "LongFullVelocityOutsideWrongSign LongFullVelocityRatioMax LongFullVelocityRatioMin "
        "LongFullVelocitySmall LongFullWeightDecay"
    ),
    statistic="LongDriftPredictedEnd LongKeyNormEnd LongKeyNormMin LongOutputPredictedEnd",
    walk="LongBkOverKeyEnd LongRate{dtype_trained}EpsEight LongRate{dtype_trained}EpsTwelve",
    walk_long="LongDriftMaxFactor LongDriftMeasuredEnd LongNormBkEnd LongOutputChangeEnd",
)
# Macros the committed results lack, each with why: template -> (class, reason).
_RETIRED = ("written by commit ea77fed, whose two-CPU results tests/data/xmachine holds, and retired "
            "since; declared so that pair is still compared by class")
CONDITIONAL_MACROS: dict[str, tuple[str, str]] = {
    "LongRatioAtTenFive": ("walk", _RETIRED),
    "LongRatioAtTenSix": ("walk", _RETIRED),
    "LongRatioHighAtTenFive": ("walk", _RETIRED),
    "LongRatioHighAtTenSix": ("walk", _RETIRED),
    "LongStepsToKey{dtype_trained}EpsEight": ("walk", _RETIRED),
    "LongStepsToKey{dtype_trained}EpsTwelve": ("walk", _RETIRED),
    "LongStepsToKeyNormMin": ("statistic", _RETIRED),
}
