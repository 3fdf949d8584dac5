"""Columns of the training study's data tables and the output class of each.

Every column of every `results/data/*.csv` this study writes is declared here once: `exact`,
`machine`, or the name of a tolerance in `keybias.pipeline.outputs.TOLERANCES`. `make verify` and
the column test read these declarations; a column written but not declared fails a test.
"""

from keybias.studies.columns import cols

# data/<file>.csv -> column -> class
TABLES: dict[str, dict[str, str]] = {
    "data/training_bias_summary.csv": cols(
        exact="setting optimizer eps dtype seed lr steps powered_steps",
        accuracy="test_acc",
        trained="norm_b_q norm_b_v norm_b_k_initial decayed_norm sgd_bound",
        chaotic="norm_b_k grad_rms_b_q drift_over_predicted predicted_drift random_walk_drift",
        noise="drift_b_k grad_rms_b_k max_grad_over_tolerance max_grad_over_tolerance_powered "
        "sgd_walk_ratio",
        statistic="sgd_walk sgd_walk_ratio_b_q detectable_gradient_fraction",
    ),
    "data/training_bias_trajectories.csv": cols(
        exact="setting optimizer dtype eps seed step lr weight_decay n_bias",
        accuracy="test_acc",
        trained="norm_b_q norm_b_v",
        chaotic="norm_b_k loss grad_rms_b_q",
        noise="drift_b_k grad_rms_b_k grad_max_b_k grad_tolerance grad_over_tolerance grad_max_b_q",
    ),
    "data/training_curves.csv": cols(
        exact="optimizer dtype seed step lr eps n_test",
        images="kept_only_correct removed_only_correct control_discordant",
        curve="loss_removed loss_kept loss_control",
        accuracy="test_acc_removed test_acc_kept test_acc_control",
        noise32="param_divergence_control param_divergence_control_down",
        vs_param_control="param_divergence_kept",
    ),
    "data/training_pairs.csv": cols(
        exact="optimizer seed steps n_test",
        images="kept_only_correct removed_only_correct control_discordant",
        diverge_steps="identical_steps",
        accuracy="test_acc_removed test_acc_kept test_acc_control acc_standard_error",
        acc_diff="acc_diff acc_diff_control",
        noise32="max_loss_rel_diff_control final_divergence_control final_divergence_control_down",
        vs_loss_control="max_loss_rel_diff",
        vs_divergence_control="final_divergence_kept",
    ),
    "data/training_verdicts.csv": cols(
        exact="seed dtype eps optimizer setting layer verdict prediction_changes device",
        chaotic="norm_b_k control_delta",
        noise="delta tolerance logit_delta",
    ),
}


# results/macros/04_training.tex: every macro this study writes there, by name -> its class
# (as for columns).
# `{axis}` stands for each value of that axis (keybias.pipeline.macro_classes.AXES, or
# MACRO_AXES below); `make verify` expands the templates and looks each name up exactly.
MACRO_FILE = "macros/04_training.tex"
MACRO_AXES: dict[str, tuple[str, ...]] = {
    "optimiser": ("Adam", "Sgd"),
}
MACROS: dict[str, str] = cols(
    exact=(
        "TrainAccPairedImages TrainAdamFactorBound TrainBatch TrainBiasSeeds TrainBiasSettings "
        "TrainDecayDevBound TrainDiscordantFractionBound TrainDivergenceBound TrainEmbedDim "
        "TrainEpsDefault TrainGradPoweredRuns TrainGradPoweredRuns{dtype_trained} TrainGradRatioBound "
        "TrainGradRuns TrainGradRuns{dtype_trained} TrainHeads TrainKeyBiasInit TrainLayers "
        "TrainLr{optimiser} TrainMomentum TrainNParams TrainNTest TrainNTrain TrainSeeds "
        "TrainSgdPoweredRuns TrainSgdRuns TrainSgdWalkBound TrainSteps TrainTokens TrainVerdictInvalid "
        "TrainVerdictNotRedundant TrainVerdictRedundant TrainVerdictTotal TrainWeightDecay"
    ),
    acc_diff="TrainMaxAccDiff{optimiser}",
    accuracy=(
        "TrainAccAdamEpsEight TrainAccAdamEpsEightBfloatSixteen TrainAccAdamEpsSix TrainAccAdamEpsTwelve "
        "TrainAccAdamW TrainAccAdamWBiasDecay TrainAccDiscordantBound TrainAccDiscordantControl "
        "TrainAccKept{optimiser} TrainAccRemoved{optimiser} TrainAccSgd TrainAccSgdBfloatSixteen "
        "TrainAccSgdMomentum"
    ),
    chaotic=(
        "TrainAdamFactor TrainAdamLogErr TrainAdamMinDetectable TrainDecayDev TrainDecayEffectOverBound "
        "TrainGradRmsQuery{dtype_trained}"
    ),
    diverge_steps="TrainIdenticalSteps{optimiser}",
    images="TrainAccDiscordant TrainAccMinDetectable",
    noise=(
        "TrainDivergenceMinDetectable TrainDivergenceRatio TrainDriftAdamEpsEight "
        "TrainDriftAdamEpsEightBfloatSixteen TrainDriftAdamEpsSix TrainDriftAdamEpsTwelve "
        "TrainDriftAdamMax TrainDriftAdamW TrainDriftAdamWBiasDecay TrainDriftSgd "
        "TrainDriftSgdBfloatSixteen TrainDriftSgdMomentum TrainGradRatio TrainGradRmsKey{dtype_trained} "
        "TrainLossRelDiff{optimiser} TrainMaxLogitDelta TrainSgdDriftMax TrainSgdWalkRatio"
    ),
    noise32="TrainDivergenceControl{optimiser} TrainDivergence{optimiser} TrainLossRelDiffControl{optimiser}",
    statistic=(
        "TrainGradDetectable TrainPredAdamEpsEight TrainPredAdamEpsEightBfloatSixteen TrainPredAdamEpsSix "
        "TrainPredAdamEpsTwelve TrainPredAdamW TrainPredAdamWBiasDecay TrainPredictionChanges"
    ),
    trained="TrainVerdictMinDetectable",
)
