"""Columns of the precision study's data tables and the output class of each.

Every column of every `results/data/*.csv` this study writes is declared here once: `exact`,
`machine`, or the name of a tolerance in `keybias.pipeline.outputs.TOLERANCES`. `make verify` and
the column test read these declarations; a column written but not declared fails a test.
"""

from keybias.studies.columns import cols

# data/<file>.csv -> column -> class
TABLES: dict[str, dict[str, str]] = {
    "data/precision_accuracy.csv": cols(
        exact="dtype path factor", rms_error="err0_rms", fit="crossing crossing_pred",
    ),
    "data/precision_devices.csv": cols(exact="device status reason"),
    "data/precision_errors.csv": cols(
        exact="device dtype path ratio head_dim num_heads seq_len batch seed status reason "
        "unit_roundoff finite",
        f32="bias_norm key_norm ref_rms score_std_max score_std_rms",
        rms_error="delta_rms delta_rel err_rms err0_rms pred_rms pred_bias_rms pred_floor_rms "
        "tolerance floor_rms",
        noise="delta_max delta_bias_rms",
    ),
    "data/precision_errors_calibration.csv": cols(  # the same computation on a held-out seed
        exact="device dtype path ratio head_dim num_heads seq_len batch seed status reason "
        "unit_roundoff finite",
        f32="bias_norm key_norm ref_rms score_std_max score_std_rms",
        rms_error="delta_rms delta_rel err_rms err0_rms pred_rms pred_bias_rms pred_floor_rms "
        "tolerance floor_rms",
        noise="delta_max delta_bias_rms",
    ),
    "data/precision_gradient_summary.csv": cols(
        exact="device dtype path unit_roundoff status reason batches verdict bk_nonzero",
        noise="ratio_median ratio_over_u grad_over_tol_max control_over_tol_min",
        f32="bq_mean_cos bq_consistency eff_dim cos_bound",
        noise_stat="bk_mean_cos bk_consistency",
    ),
    "data/precision_gradients.csv": cols(
        exact="device dtype path unit_roundoff head_dim num_heads seq_len batch status reason "
        "batch_index seed verdict finite",
        f32="g_bq_norm g_bq_max eff_dim",
        noise="g_bk_norm g_bk_max ratio tolerance",
    ),
    "data/precision_law.csv": cols(
        exact="dtype path points ratio_min ratio_max",
        slope="slope",
        fit="const_over_u model_constant",
        fit_scatter="slope_se resid_log10 model_scatter_log10",
        rms_error="const",
    ),
}


# results/macros/03_precision.tex: every macro this study writes there, by name -> its class
# (as for columns).
# `{axis}` stands for each value of that axis (keybias.pipeline.macro_classes.AXES, or
# MACRO_AXES below); `make verify` expands the templates and looks each name up exactly.
MACRO_FILE = "macros/03_precision.tex"
MACROS: dict[str, str] = cols(
    exact=(
        "PrecBatch PrecDominance PrecFailureProbability PrecFitPoints{dtype} PrecGradBatches "
        "PrecGradCaseCount PrecGradInvalidCount PrecGradNoiseBoundFactor PrecGradPoweredCount "
        "PrecGradPoweredDtypes PrecGradRedundantCount PrecHeadDim PrecInvSqrtTwo PrecLambda "
        "PrecLawFitsWithoutResidual PrecNumHeads PrecOutputExcludedCount PrecOutputJudgedCount "
        "PrecOutputJudgedDtypes PrecOutputRowCount PrecOutputScopeCount PrecOutputTolFractionPercent "
        "PrecRatioMax PrecRatioMin PrecRatioPoints PrecRho PrecSeqLen PrecSlopeMargin PrecSqrtBatchesInv "
        "PrecUnitRoundoffSpanLog PrecValidity PrecZ"
    ),
    f32="PrecBkCosMinDetectable PrecBqConsistencyMin PrecBqCosMin PrecCosBoundMin",
    fit=(
        "PrecCrossDevMax PrecCrossMax PrecCrossMax{dtype} PrecCrossMin PrecCrossMin{dtype} "
        "PrecModelConstCalibAllowance PrecModelConstCalibDevMax PrecModelConstCalibOverAllowanceMax "
        "PrecModelConstCalibScatter PrecModelConstMax PrecModelConstMin PrecModelConstOtherHalf "
        "PrecModelConstSdpaHalf PrecModelConstWide"
    ),
    fit_scatter="PrecLawResidMax PrecSlopeDetectable{dtype} PrecSlopeSe{dtype}",
    noise=(
        "PrecGradMinDetectable PrecGradNoiseScaleMax PrecGradTolMax PrecOutputMinDetectable "
        "PrecOutputTolMax PrecRatioOverUMax PrecRatioOverUMin"
    ),
    noise_stat="PrecBkConsistencyMax PrecBkCosMax",
    rms_error="PrecErrMax{dtype_half} PrecSecondOrder{dtype}",
    slope="PrecSlope{dtype}",
)
