"""Columns of the GPU study's data tables and the output class of each.

Notebook 09 judges recorded files, so every value is the same on any machine up to the last bits
of float64 arithmetic in the fits (least squares through the machine's BLAS): counts and labels are
`exact`, fitted numbers `f32` (far looser than float64 rounding, far tighter than any finding).
"""

from keybias.studies.columns import cols

TABLES: dict[str, dict[str, str]] = {
    "data/gpu_cost_verdicts.csv": cols(
        exact="block attention mode seq_len batch reps resolved model_direction",
        f32="denominator_median_s measured_saving saving_ci_low saving_ci_high saving_upper_bound predicted_saving",
    ),
    "data/gpu_invariance_verdicts.csv": cols(
        exact="category redundant not_redundant invalid skipped matches_theory joint",
    ),
    "data/gpu_precision_law.csv": cols(
        exact="dtype path points ratio_min ratio_max",
        f32="slope slope_se const const_over_u resid_log10 model_constant model_scatter_log10",
    ),
    "data/gpu_transfer.csv": cols(
        exact="study claim kind comparison holds",
        f32="value bound",
    ),
}


# results/macros/09_gpu.tex: every macro this study writes there, by name -> its class
# (as for columns).
# `{axis}` stands for each value of that axis (keybias.pipeline.macro_classes.AXES, or
# MACRO_AXES below); `make verify` expands the templates and looks each name up exactly.
MACRO_FILE = "macros/09_gpu.tex"
MACROS: dict[str, str] = cols(
    exact=(
        "GpuCapability GpuCommits GpuCosWorst GpuCosWorstBound GpuCosWorstCase GpuCostBoundMinPercent "
        "GpuCostByteDeficitMaxPercent GpuCostByteExcessMaxPercent GpuCostConfigs GpuCostFaster "
        "GpuCostLowOverBoundMaxPercent GpuCostPredictedMaxPercent GpuCostPredictedMinPercent "
        "GpuCostResolved GpuCostSavingMaxPercent GpuCostSlower GpuCostUpperMaxPercent "
        "GpuCrossingWorstCase GpuCrossingWorstMeasured GpuCrossingWorstPredicted GpuCrossingWorstRatio "
        "GpuCuda GpuDate GpuDriver GpuInvKnownBreaks GpuInvMeasured GpuInvMissed GpuInvMissedDtypes "
        "GpuInvNotRedundant GpuInvPlanned GpuInvRedundant GpuInvRun GpuInvValid GpuMemoryBytesMax "
        "GpuMemoryGiB GpuMemoryRows GpuMemoryWidths GpuName GpuPowerUndetected GpuPowerUndetectedCells "
        "GpuPrecFusedDtypes GpuPrecFusedPaths GpuPrecNotRun GpuPrecPaths GpuPrecRows GpuPrecSlopeMax "
        "GpuPrecSlopeMin GpuSecondsCost GpuSecondsInvariance GpuSecondsPrecision GpuSecondsTotal GpuTorch "
        "GpuTransferChecks GpuTransferSentence"
    ),
)
