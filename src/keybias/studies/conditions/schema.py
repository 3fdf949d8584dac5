"""Columns of the conditions study's data tables and the output class of each.

Every column of every `results/data/*.csv` this study writes is declared here once: `exact`,
`machine`, or the name of a tolerance in `keybias.pipeline.outputs.TOLERANCES`. `make verify` and
the column test read these declarations; a column written but not declared fails a test.
"""

from keybias.studies.columns import cols

# data/<file>.csv -> column -> class
TABLES: dict[str, dict[str, str]] = {
    "data/conditions.csv": cols(
        exact="condition variant quantity predicted seed",
        effect="effect",  # redundant rows are float64 rounding (~1e-16): only their size reproduces
    ),
    "data/conditions_summary.csv": cols(
        exact="condition variant quantity predicted seeds bound comparison verdict claim",
        effect="effect",
    ),
    "data/conditions_quirk.csv": cols(
        exact="option",
        noise="max_abs_diff_need_weights max_abs_diff_false_vs_reference max_abs_diff_true_vs_reference",
    ),
}


# results/macros/07_conditions.tex: every macro this study writes there, by name -> its class
# (as for columns).
# `{axis}` stands for each value of that axis (keybias.pipeline.macro_classes.AXES, or
# MACRO_AXES below); `make verify` expands the templates and looks each name up exactly.
MACRO_FILE = "macros/07_conditions.tex"
MACROS: dict[str, str] = cols(
    exact=(
        "CondAdamCoupledStep CondAdamMovesMin CondAdamStillMax CondBreakMin CondBrokenCount CondCaseCount "
        "CondEmbedDim CondNumHeads CondQuirkBiasKvDiff CondQuirkTorch CondQuirkZeroAttnDiff "
        "CondRedundantCount CondRedundantMax CondSeedCount CondSoftcap CondWeightDecay"
    ),
)
