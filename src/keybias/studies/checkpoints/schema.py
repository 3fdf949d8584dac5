"""Columns of the checkpoints study's data tables and the output class of each.

`exact`, `machine`, or the name of a tolerance in `keybias.pipeline.outputs.TOLERANCES`. The bias
norms come from the stored float32 weights (float64 sums); the key norms from float32 forward
passes over ~500-700 tokens; the quantization errors are root mean squares over thousands of
rounding errors of the quantizer.
"""

from keybias.studies.columns import cols

# The quantization arms and quantizers of data/checkpoint_quantization.csv (measure's docstring): the
# column of arm `a` under quantizer `z` is quant_column(a, z); the token quantizer keeps the
# pre-registered names err_keep and err_strip.
QUANT_ARMS = ("keep", "strip", "smooth")
QUANTIZERS = ("token", "channel")
ERR_SMOOTH = "err_smooth"
ERR_KEEP_CHANNEL = "err_keep_channel"
ERR_STRIP_CHANNEL = "err_strip_channel"
ERR_SMOOTH_CHANNEL = "err_smooth_channel"


def quant_column(arm: str, quantizer: str) -> str:
    """The error column of one arm and quantizer: err_keep, err_smooth_channel, ..."""
    if arm not in QUANT_ARMS or quantizer not in QUANTIZERS:
        raise ValueError(f"unknown quantization arm {arm!r} or quantizer {quantizer!r}")
    return f"err_{arm}" + ("" if quantizer == "token" else f"_{quantizer}")


TABLES: dict[str, dict[str, str]] = {
    "data/checkpoint_bias_norms.csv": cols(
        exact="checkpoint family layer tokens",
        f64="bq_norm bk_norm bv_norm bk_over_bq",
        f32="key_rms bk_over_key offset_over_key",
    ),
    "data/checkpoint_quantization.csv": cols(
        exact="checkpoint family layer bits",
        rms_error=(f"err_keep err_strip {ERR_SMOOTH} {ERR_KEEP_CHANNEL} {ERR_STRIP_CHANNEL} {ERR_SMOOTH_CHANNEL} "
                   "control_err_keep control_err_strip"),
    ),
    "data/checkpoint_summary.csv": cols(
        exact="checkpoint family layers",
        f64="bk_over_bq_max bk_over_bq_median",
        f32="bk_over_key_max bk_over_key_median",
    ),
    "data/checkpoint_gradient_noise.csv": cols(
        exact="checkpoint family layer dtype",
        noise="grad_bk_rms",
        f32="grad_bq_rms",
    ),
    "data/checkpoint_drift_prediction.csv": cols(
        exact="checkpoint family lr eps steps",
        noise="sigma_float32 sigma_float64 drift_linear drift_walk",
        f32="grad_bq_rms_median",
        f64="bk_norm_max",
    ),
    "data/checkpoint_packages.csv": cols(
        exact="checkpoint family package version format matrices layers hidden heads",
    ),
}


# results/macros/10_checkpoints.tex: every macro this study writes there, by name -> its class
# (as for columns).
# `{axis}` stands for each value of that axis (keybias.pipeline.macro_classes.AXES, or
# MACRO_AXES below); `make verify` expands the templates and looks each name up exactly.
MACRO_FILE = "macros/10_checkpoints.tex"
MACRO_AXES: dict[str, tuple[str, ...]] = {
    "bits": ("Eight", "Four"),
    "checkpoint": ("EFive", "MiniLMSix", "MiniLMThree"),
    "quantizer": ("Token", "Channel"),
}
MACROS: dict[str, str] = cols(
    exact="CkptCount CkptFamilies CkptHeldOutBound CkptSentences Ckpt{checkpoint}Layers",
    f32="Ckpt{checkpoint}BkOverKeyMax Ckpt{checkpoint}BkOverKeyMedian Ckpt{checkpoint}GradBq",
    f64=(
        "CkptHeldOutMiniLMMax Ckpt{checkpoint}BkNormMax Ckpt{checkpoint}BkOverBqMax "
        "Ckpt{checkpoint}BkOverBqMedian"
    ),
    noise=(
        "CkptMiniLMSixDriftLinear CkptMiniLMSixDriftWalk Ckpt{checkpoint}GradNoise "
        "Ckpt{checkpoint}GradNoiseSixtyFour"
    ),
    rms_error=(
        "CkptQuant{bits}ControlRatioMedian CkptQuant{bits}RatioMedian "
        "CkptQuant{bits}{checkpoint}KeepMedian CkptQuant{bits}{checkpoint}RatioMedian "
        "CkptQuant{bits}{checkpoint}StripMedian CkptQuant{bits}{checkpoint}ControlRatioMedian "
        # descriptive, not pre-registered (judge.baseline_macros): the mean-key baseline, the
        # per-channel quantizer and what sets the per-layer gain of stripping b_k
        "CkptQuant{bits}{quantizer}SmoothRatioMedian CkptQuant{bits}{quantizer}StripOverSmoothMedian "
        "CkptQuant{bits}{quantizer}{checkpoint}SmoothRatioMedian "
        "CkptQuant{bits}{quantizer}{checkpoint}StripOverSmoothMedian "
        "CkptQuant{bits}ChannelRatioMedian CkptQuant{bits}Channel{checkpoint}RatioMedian "
        "CkptQuant{bits}Channel{checkpoint}KeepMedian "
        "CkptQuant{bits}GainCorr CkptQuant{bits}EFiveGainCorr"
    ),
)
