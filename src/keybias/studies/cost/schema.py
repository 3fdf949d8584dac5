"""Columns of the cost study's data tables and the output class of each.

Every column of every `results/data/*.csv` this study writes is declared here once: `exact`,
`machine`, or the name of a tolerance in `keybias.pipeline.outputs.TOLERANCES`. `make verify` and
the column test read these declarations; a column written but not declared fails a test.
"""

from keybias.studies.columns import cols

# data/<file>.csv -> column -> class
TABLES: dict[str, dict[str, str]] = {
    "data/cost_memory.csv": cols(
        exact="architecture embed_dim layers attention_layer_params model_params bk_params "
        "bk_grad bk_adam_state bk_sgd_momentum_state bk_training_adam_bytes "
        "model_training_adam_bytes bk_fraction_of_attention_layer bk_fraction_of_model "
        "checked_with model_params_module bk_params_module match",
    ),
    "data/cost_memory_allocator.csv": cols(
        exact="device embed_dim optimizer expected_bytes measured_bytes peak_bytes match status reason",
    ),
    "data/cost_memory_layer.csv": cols(
        exact="embed_dim layer_params_module layer_params_formula bk_params_module "
        "bk_params_formula bk_fraction_of_layer match",
    ),
    # counted in one traced step (keybias.studies.cost.traffic), no clock: the same on any machine
    "data/cost_saving_bounds.csv": cols(
        exact="block attention mode embed_dim seq_len batch kernels_with_bk kernels_without_bk bytes_with_bk "
        "bytes_without_bk removed_kernel_share removed_byte_share saving_bound",
    ),
    "data/cost_gpu_prediction.csv": cols(
        exact="block attention mode embed_dim seq_len batch gpu gpu_tag bandwidth_bytes_per_s "
        "removed_bytes predicted_saving_us kind",
    ),
}


# results/macros/06_cost.tex: every macro this study writes there, by name -> its class
# (as for columns).
# `{axis}` stands for each value of that axis (keybias.pipeline.macro_classes.AXES, or
# MACRO_AXES below); `make verify` expands the templates and looks each name up exactly.
MACRO_FILE = "macros/06_cost.tex"
MACROS: dict[str, str] = cols(
    exact=(
        "CostArchitectureCount CostAttentions CostBatch CostBenchAttentions CostBenchBlocks "
        "CostBenchSeqLens CostBertEmbedDim CostBkAdamBytesGptXL CostBkFractionLayerPercent "
        "CostBkParamsBertBase CostBkParamsGptXL CostBlocks CostBudgetSeconds CostByteMarginPercent "
        "CostComparisons CostComparisonsInference CostComparisonsTraining CostConfigs CostControlCount "
        "CostFamilySize CostGpuHOneHundredBandwidthTBs CostGpuHOneHundredName "
        "CostGpuHOneHundredPredictedMaxUs CostGpuHOneHundredPredictedMinUs CostGpuHTwoHundredBandwidthTBs "
        "CostGpuHTwoHundredName CostGpuHTwoHundredPredictedMaxUs CostGpuHTwoHundredPredictedMinUs "
        "CostKernelsInference CostKernelsRemovedInference CostKernelsRemovedTraining CostKernelsTraining "
        "CostLevelPercent CostMaxReps CostMinReps CostModelFractionMaxPercent CostModelFractionMinPercent "
        "CostRemovedByteShareInferencePercent CostRemovedByteShareTrainingPercent "
        "CostSavingBoundMaxPercent CostSavingBoundMinPercent CostSeqLens CostSubphaseCount "
        "CostTargetHalfWidthPercent CostTrimPercent"
    ),
    machine="CostClock",
)
