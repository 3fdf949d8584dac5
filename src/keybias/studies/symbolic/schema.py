"""Columns of the symbolic study's data tables and the output class of each.

Every column of every `results/data/*.csv` this study writes is declared here once: `exact`,
`machine`, or the name of a tolerance in `keybias.pipeline.outputs.TOLERANCES`. `make verify` and
the column test read these declarations; a column written but not declared fails a test.
"""

from keybias.studies.columns import cols

# data/<file>.csv -> column -> class
TABLES: dict[str, dict[str, str]] = {
    "data/symbolic_grid.csv": cols(
        exact="n_keys head_dim num_heads derivatives nonzero_derivatives query_bias_controls "
        "nonzero_query_bias_controls",
    ),
}


# results/macros/01_symbolic.tex: every macro this study writes there, by name -> its class
# (as for columns).
# `{axis}` stands for each value of that axis (keybias.pipeline.macro_classes.AXES, or
# MACRO_AXES below); `make verify` expands the templates and looks each name up exactly.
MACRO_FILE = "macros/01_symbolic.tex"
MACROS: dict[str, str] = cols(
    exact=(
        "SymAssumptionCount SymGridDerivatives SymGridMaxHeadDim SymGridMaxHeads SymGridMaxKeys "
        "SymGridSizes SymQueryBiasDelta SymValueBiasDelta"
    ),
)
