"""Columns of the longrun study's data tables and the output class of each.

Every column of every `results/data/*.csv` this study writes is declared here once: `exact`,
`machine`, or the name of a tolerance in `keybias.build.outputs.TOLERANCES`. `make verify` and
the column test read these declarations; a column written but not declared fails a test.
"""

from keybias.studies.columns import cols

# data/<file>.csv -> column -> class
TABLES: dict[str, dict[str, str]] = {
    "data/longrun_trajectory.csv": cols(
        exact="role dtype eps seed step layer lr n_bias",
        walk_long="norm_b_k drift_b_k grad_rms_b_k noise_sum",
        loss="loss",
    ),
    "data/longrun_grid.csv": cols(
        exact="role dtype eps seed step layer lr n_bias",
        walk="norm_b_k drift_b_k grad_rms_b_k noise_sum",
        loss="loss",
    ),
    "data/longrun_probes.csv": cols(
        exact="role dtype eps seed step layer",
        walk_long="norm_b_k output_change_rms predicted_bias_rms",
        statistic="key_norm predicted_change_rms",
    ),
    "data/longrun_grid_probes.csv": cols(
        exact="role dtype eps seed step layer",
        walk="norm_b_k output_change_rms predicted_bias_rms",
        statistic="key_norm predicted_change_rms",
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
    "data/longrun_extrapolation.csv": cols(
        exact="layer steps",
        exponent="exponent exponent_high",
        walk="norm_b_k key_norm steps_to_key_norm",
        walk_long="ratio_at_100000 ratio_at_1000000 ratio_high_at_100000 ratio_high_at_1000000",
    ),
}
