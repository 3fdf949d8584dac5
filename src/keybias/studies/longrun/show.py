"""Drift of the key bias over a long run: show (figures and LaTeX tables from the judged frames)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from keybias.studies import style


def _eps_label(eps: float) -> str:
    exponent = int(round(math.log10(eps)))
    return f"eps=1e{exponent}"


def plot_drift(grid: pd.DataFrame, comparison: pd.DataFrame, extrap: pd.DataFrame, probes_long: pd.DataFrame,
               predicted_far: pd.DataFrame):
    """Left: the grid's drift (mean over seeds and layers) per dtype and eps. Right: the long run, per
    layer measured drift (solid) and the grid's prediction (dashed), continued to the extrapolation
    horizon, with each layer's typical key norm ||k|| (dotted): where a dashed line would meet its
    dotted line, b_k reaches the costly regime."""
    import matplotlib.pyplot as plt

    style.apply()
    fig, axes = plt.subplots(1, 2, figsize=(style.FULL_WIDTH, 2.6))
    ax = axes[0]
    for i, ((dtype, eps), g) in enumerate(grid.groupby(["dtype", "eps"], sort=False)):
        mean = g.groupby("step")["drift_b_k"].mean()
        ax.loglog(mean.index, mean.clip(lower=1e-12).to_numpy(), color=style.OKABE_ITO[i % 8],
                  label=f"{dtype}, {_eps_label(eps)}")
    ax.set(xlabel="step", ylabel=r"drift $\|b_k(t)-b_k(0)\|$", title="short grid (mean over seeds, layers)")
    style.legend_outside(fig, ncol=2)

    ax = axes[1]
    layers = sorted(comparison["layer"].unique())
    for j, layer in enumerate(layers):
        color = style.OKABE_ITO[(j + 4) % 8]
        g = comparison[comparison["layer"] == layer]
        ax.loglog(g["step"], g["drift_b_k"].clip(lower=1e-12), color=color, lw=1.2, label=f"layer {layer}")
        far = predicted_far[predicted_far["layer"] == layer]
        ax.loglog(far["step"], far["predicted_drift"].clip(lower=1e-12), color=color, lw=0.9, ls="--")
        row = extrap[extrap["layer"] == layer].iloc[0]
        t_end = float(row["steps"])
        ts = np.geomspace(t_end, float(far["step"].max()), 20)
        ax.loglog(ts, float(row["norm_b_k"]) * (ts / t_end) ** float(row["exponent"]), color=color, lw=0.9,
                  ls="-.")
        ax.axhline(float(row["key_norm"]), color=color, lw=0.8, ls=":")
    ax.axvline(float(comparison["grid_steps"].iloc[0]), color="0.5", lw=0.6)
    ax.set(xlabel="step", ylabel=r"$\|b_k\|$-drift; $\|k\|$ dotted",
           title="long run: measured, extrapolated (dash-dot), predicted (dashed)")
    ax.legend(loc="upper left", fontsize=7.0, frameon=False)
    fig.tight_layout()
    return fig


def plot_output_error(probes: pd.DataFrame):
    """The attention-output change b_k causes in the long run (per layer, RMS per entry) against
    notebook 03's first-order rounding law, at every probe."""
    import matplotlib.pyplot as plt

    style.apply()
    fig, ax = plt.subplots(figsize=(style.FULL_WIDTH, 2.4))
    g = probes[probes["step"] > 0]
    for j, layer in enumerate(sorted(g["layer"].unique())):
        h = g[g["layer"] == layer]
        ax.loglog(h["predicted_change_rms"], h["output_change_rms"].clip(lower=1e-12), "o", ms=3,
                  color=style.OKABE_ITO[(j + 4) % 8], label=f"layer {layer}")
    lo = float(np.nanmin(g[["predicted_change_rms", "output_change_rms"]].clip(lower=1e-12).to_numpy()))
    hi = float(np.nanmax(g[["predicted_change_rms", "output_change_rms"]].to_numpy()))
    ax.loglog([lo, hi], [lo, hi], color="0.4", lw=0.8, ls="--", label="equal")
    ax.set(xlabel="predicted (notebook 03 law)", ylabel="measured RMS change")
    style.legend_outside(ax)
    fig.tight_layout()
    return fig


def _fmt(value) -> str:
    from keybias.build.recorder import format_number

    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return r"$\infty$" if value == math.inf else "--"
    return "$" + format_number(float(value), 2) + "$"


def extrapolation_table_latex(extrap: pd.DataFrame, horizons) -> str:
    """Per layer: ||b_k|| and ||k|| at the end of the long run, the step at which they would meet,
    and ||b_k|| / ||k|| at each horizon."""
    header = ["layer", r"$\|b_k\|$", r"$\|k\|$", "exponent", r"steps to $\|b_k\|=\|k\|$"]
    header += [rf"$\|b_k\|/\|k\|$ at ${_fmt(h).strip('$')}$" for h in horizons]
    lines = [r"\begin{tabular}{l" + "r" * (len(header) - 1) + "}", r"\toprule", " & ".join(header) + r" \\",
             r"\midrule"]
    for _, r in extrap.iterrows():
        cells = [str(int(r["layer"])), _fmt(r["norm_b_k"]), _fmt(r["key_norm"]), _fmt(r["exponent"]),
                 _fmt(r["steps_to_key_norm"])]
        cells += [_fmt(r[f"ratio_at_{int(h)}"]) for h in horizons]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)


def grid_table_latex(summary: pd.DataFrame) -> str:
    """The grid summary (`judge.grid_summary`) as a booktabs tabular."""
    header = ["dtype", "eps", "steps", "seeds", r"drift of $b_k$", r"median RMS $g_{b_k}$", r"rate $r$", r"$\|k\|$",
              r"steps to $\|b_k\|=\|k\|$"]
    lines = [r"\begin{tabular}{llrrrrrrr}", r"\toprule", " & ".join(header) + r" \\", r"\midrule"]
    for _, r in summary.iterrows():
        cells = [str(r["dtype"]), _fmt(r["eps"]), str(int(r["steps"])), str(int(r["seeds"])), _fmt(r["drift_b_k"]),
                 _fmt(r["grad_rms_b_k"]), _fmt(r["noise_rate"]), _fmt(r["key_norm"]), _fmt(r["steps_to_key_norm"])]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)
