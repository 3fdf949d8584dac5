"""Columns of the pretrained study's data tables and the output class of each.

Every column of every `results/data/*.csv` this study writes is declared here once: `exact`,
`machine`, or the name of a tolerance in `keybias.pipeline.outputs.TOLERANCES`. `make verify` and
the column test read these declarations; a column written but not declared fails a test.
"""

from keybias.studies.columns import cols

# data/<file>.csv -> column -> class
TABLES: dict[str, dict[str, str]] = {
    "data/pretrained_families.csv": cols(
        exact="family model expected strip fold reason key_bias_removed value_bias_folded not_handled",
        f64="bound",
        noise="forced_change whole_change certified_max_ratio",
    ),
    "data/pretrained_architectures.csv": cols(
        exact="model_type model_class status strip fold reason key_bias_sites parameters",
        noise="output_change output_bound naive_change naive_unit_change naive_unit_bound",
    ),
    "data/pretrained_bias_norms.csv": cols(
        exact="layer",
        f32="bq_norm bk_norm bv_norm wk_fro_over_sqrt_din key_norm_median bk_over_key_norm",
    ),
    "data/pretrained_embedding_changes.csv": cols(
        exact="dtype variant parameters_saved tolerance_kind verdict device num_threads",
        noise="max_abs_diff noise_floor over_noise_floor",
        rms_error="tolerance",
        f32="min_cosine analytic_tolerance",
    ),
    "data/pretrained_parameters_saved.csv": cols(
        exact="model layers hidden_size total_parameters key_bias_parameters "
        "value_bias_parameters config_count fraction_key_bias counted_by",
    ),
}

# The macros of macros/05_pretrained.tex: exact names, or templates over the axes of
# keybias.pipeline.macro_classes.AXES and MACRO_AXES below; `make verify` looks each name up exactly.
MACRO_FILE = "macros/05_pretrained.tex"
MACRO_AXES: dict[str, tuple[str, ...]] = {
    "model": ("BertBase", "BertLarge", "GPTTwo", "ViTBase"),
    "variant": ("Both", "Fold", "Noise", "Random", "Strip", "Zero"),
}
MACROS: dict[str, str] = cols(
    exact=(
        "PretArchClassified PretArchFolded PretArchHandled PretArchHandledOver PretArchNoKeyBias "
        "PretArchNotBuilt PretArchNotCertified PretArchRefusalsNotNeeded PretArchRefused PretArchRemoved "
        "PretArchTimm PretArchTotal PretArchViolations PretBatch PretFamilies PretFamiliesHandled "
        "PretFamiliesRefused PretFamiliesWrong PretFraction{model} PretHidden PretLayers PretNoiseBatch "
        "PretParams PretRandomScale PretSavedBoth PretSavedStrip PretSaved{model} PretSentences "
        "PretThreads PretTolMeasuredCount PretTolRowCount PretTolSentence PretTotal{model}"
    ),
    f32=(
        "PretBkNormMax PretBkNormMin PretBkOverBqMax PretBkOverKeyMax PretBqNormMax PretBqNormMin "
        "PretBvNormMax PretBvNormMin PretControlCosGap{dtype_wide} PretControlDiff{dtype_wide} "
        "PretFamiliesControlRatio PretFamiliesRefusedRatio PretKeyNormMax PretKeyNormMin"
    ),
    noise=(
        "PretControlOverNoise{dtype_wide} PretFamiliesCertifiedMax PretFamiliesHandledRatio "
        "Pret{variant}CosGap{dtype_wide} Pret{variant}Diff{dtype_wide} Pret{variant}OverNoise{dtype_wide}"
    ),
    rms_error="PretControlTol{dtype_wide} Pret{variant}Tol{dtype_wide}",
)
