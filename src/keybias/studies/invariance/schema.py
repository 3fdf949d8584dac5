"""Columns of the invariance study's data tables and the output class of each.

Every column of every `results/data/*.csv` this study writes is declared here once: `exact`,
`machine`, or the name of a tolerance in `keybias.pipeline.outputs.TOLERANCES`. `make verify` and
the column test read these declarations; a column written but not declared fails a test.
"""

from keybias.studies.columns import cols

CONFIG_MHA = (
    "family case variant option mode mask embed_dim num_heads kdim vdim tgt_len src_len batch "
    "batch_first bias add_bias_kv add_zero_attn dropout need_weights self_attention dtype device "
    "sdpa_backend hf_attn_implementation seed code_path sdpa_backend_used status reason n_slots "
    "head_dim working_dtype expected assumption training grad_enabled fastpath_enabled grad_reason"
)

# data/<file>.csv -> column -> class
TABLES: dict[str, dict[str, str]] = {
    "data/invariance.csv": cols(
        exact=f"{CONFIG_MHA} nonfinite_outputs output_entries masked_row_output verdict "
        "verdict_float64 drop_verdict grad_verdict verdict_joint tolerance_rule magnitudes_judged "
        "config_id independent power_probe_states power_blind_states",
        f32="typical_key_norm output_abs_max grad_tolerance grad_bv",
        effect32="max_rel_bk",
        noise="noise_floor_rel noise_floor_over_tol64 max_rel_drop drop_tolerance_rel drop_control_rel grad_bk grad_bq "
        "grad_ratio power_tolerance_rel decision_margin_min",
        statistic="null_factor",
        decade_grid="min_detectable_eps min_detectable_eps_perturbed",  # bisections on a decade grid
    ),
    "data/invariance_magnitudes.csv": cols(
        exact="config_id magnitude cell_powered verdict verdict_float64 verdict_joint",
        effect_mag="bk_rel",
        noise="bk_abs control_abs tolerance_abs tolerance_rel control_rel analytic_rel "
        "null_base_rel null_perturbed_rel bk_rel_float64 tolerance_rel_float64 joint_rel joint_tolerance_rel "
        "decision_margin",
    ),
    "data/invariance_null_calibration.csv": cols(
        exact="dtype case seed embed_dim num_heads tgt_len src_len batch mode mask need_weights "
        "batch_first magnitude",
        noise="change null_sum",
        null_ratio="ratio",
    ),
    "data/invariance_power_calibration.csv": cols(
        exact="dtype group pool case option variant seed embed_dim src_len mode mask need_weights magnitude verdict "
        "verdict_float64",
        noise="bk_rel_float64 tolerance_rel",
    ),
}


# results/macros/02_invariance.tex: every macro this study writes there, by name -> its class
# (as for columns).
# `{axis}` stands for each value of that axis (keybias.pipeline.macro_classes.AXES, or
# MACRO_AXES below); `make verify` expands the templates and looks each name up exactly.
MACRO_FILE = "macros/02_invariance.tex"
MACRO_AXES: dict[str, tuple[str, ...]] = {
    "arch": ("Alibi", "Bert", "BiasKv", "Cosine", "Plain", "QkNorm", "Qwen", "Rope", "Sigmoid", "SinkKey", "SinkLogit", "ZeroAttn"),
    "magnitude": ("MagLarge", "MagOne", "MagSmall"),
}
MACROS: dict[str, str] = cols(
    exact=(
        "InvCalibrationCases InvConfigCount InvConfigTotal InvContradictionsTotal "
        "InvContradictions{dtype} InvDropBelowResolution InvDropRows InvDtypeCount InvEmbedMax "
        "InvEmbedMin InvEpsMax InvEpsMin InvFailureProbability InvFamilyAlpha InvFamilyCount "
        "InvFastPathRows InvGradDisagree InvGradJudgedHalf InvGradLowPrecisionMissed InvIndependentTotal "
        "InvIndependent{dtype} InvInvalid InvInvalidLowPrecision InvJointJudgedHalf InvKeysMax InvKeysMin "
        "InvKnownBreaks{dtype}{magnitude} InvKnownModules{dtype}{magnitude} InvLambda InvMagnitudeCount "
        "InvMagnitudeMax InvMagnitudeMin InvMaskedRowAppended InvMaskedRowBias InvMaskedRowNan "
        "InvMaskedRows InvMaxMissRate InvMaxRedundantOverTol InvMaxToleranceFraction InvMeasured "
        "InvMinNotRedundantOverTol InvMismatches InvMissLevel InvMissLowerLimit{dtype}{magnitude} "
        "InvMissedModules{dtype}{magnitude} InvMissed{dtype}{magnitude} InvNonfiniteOther InvNotRedundant "
        "InvNotRequested InvNullScales InvPowerBlindStates InvPowerBound InvRealisticEmbedMax "
        "InvRealisticEmbedMin InvRealisticKeysMax InvRealisticMismatches InvRealisticRows "
        "InvRealisticValid InvRedundant InvRejected InvSeparation InvSkipped "
        "InvTieMisses{dtype}{magnitude} InvValid InvValid{dtype}{magnitude} InvVariantCount Inv{arch}Rows"
    ),
    decade_grid="InvMinDetect{dtype}",
    effect32="Inv{arch}MaxRel Inv{arch}MinRel",
    half_verdicts="InvDropFalseBreaksHalf InvDropRedundantHalf InvGradContradictionsHalf InvJointRedundantHalf",
    noise=(
        "InvBreakOverTol{dtype}{magnitude} InvDropMinDetectable InvGradMinDetectable "
        "InvJointMinDetectable InvRedundantOverTol{dtype}{magnitude}"
    ),
    statistic="InvNullFactor{dtype_rounded}",
)
