"""Drift of the key bias over a long run: show (figures and LaTeX tables from the judged frames)."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from keybias.core.recorder import format_number
from keybias.studies import style, tables
from keybias.studies.longrun import judge_full


def _eps_label(eps: float) -> str:
    exponent = int(round(math.log10(eps)))
    return rf"$\varepsilon=10^{{{exponent}}}$"


def plot_drift(grid: pd.DataFrame, comparison: pd.DataFrame, probes_long: pd.DataFrame):
    """Left: the grid's drift (mean over seeds and layers) per dtype and eps. Right: the long run, per
    layer measured drift (solid) and the grid's prediction from notebook 04's law (dashed), over the
    measured steps only, with each layer's typical key norm ||k|| at the probes (dotted)."""
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
    for j, layer in enumerate(sorted(comparison["layer"].unique())):
        color = style.OKABE_ITO[(j + 4) % 8]
        g = comparison[comparison["layer"] == layer]
        ax.loglog(g["step"], g["drift_b_k"].clip(lower=1e-12), color=color, lw=1.2, label=f"layer {layer}")
        ax.loglog(g["step"], g["predicted_drift"].clip(lower=1e-12), color=color, lw=0.9, ls="--")
        p = probes_long[(probes_long["layer"] == layer) & (probes_long["step"] > 0)]
        ax.loglog(p["step"], p["key_norm"], color=color, lw=0.8, ls=":")
    ax.axvline(float(comparison["grid_steps"].iloc[0]), color="0.5", lw=0.6)
    ax.set(xlabel="step", ylabel=r"drift; $\|k\|_{\mathrm{typ}}$ dotted", title="long run: measured, and the law (dashed)")
    ax.legend(loc="upper left", fontsize=7.0, frameon=False)
    fig.tight_layout()
    return fig


def plot_output_error(probes: pd.DataFrame):
    """The attention-output change b_k causes in the long run (per layer, RMS per entry) against
    notebook 03's first-order rounding law, at every probe."""
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
    ax.set(xlabel="predicted by the rounding law", ylabel="measured RMS change")
    style.legend_outside(ax)
    fig.tight_layout()
    return fig


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return r"$\infty$" if value == math.inf else "--"
    return "$" + format_number(float(value), 2) + "$"


def grid_table_latex(summary: pd.DataFrame) -> str:
    """The grid summary (`judge.grid_summary`) as a booktabs tabular."""
    header = ["dtype", "eps", "steps", "seeds", r"drift of $b_k$", r"median RMS $g_{b_k}$", r"rate $\kappa$", r"$\|k\|_{\mathrm{typ}}$"]
    lines = [r"\begin{tabular}{llrrrrrr}", r"\toprule", " & ".join(header) + r" \\", r"\midrule"]
    for _, r in summary.iterrows():
        cells = [str(r["dtype"]), _fmt(r["eps"]), str(int(r["steps"])), str(int(r["seeds"])), _fmt(r["drift_b_k"]),
                 _fmt(r["grad_rms_b_k"]), _fmt(r["noise_rate"]), _fmt(r["key_norm"])]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the recorded full grid

REGIME_LABEL = {("float32", 1e-12): r"float32, $\varepsilon=10^{-12}$",
                ("float32", 1e-8): r"float32, $\varepsilon=10^{-8}$ (default)",
                ("bfloat16", 1e-8): r"bfloat16, $\varepsilon=10^{-8}$ (default)"}


def _regime(dtype, eps) -> str:
    for (d, e), label in REGIME_LABEL.items():
        if d == dtype and math.isclose(float(eps), e, rel_tol=1e-9):
            return label
    return f"{dtype}, {_eps_label(float(eps))}"


def plot_full_drift(traj: pd.DataFrame, intervals: pd.DataFrame):
    """Per size (panel) and regime: the median over runs and layers of ||b_k(t) - b_k(0)|| and its range, with
    reference slopes 1/2 (walk) and 1 (constant velocity) through the end of the float32 eps 1e-12 runs.
    Returns (figure, caption); the caption's numbers are the exponent intervals the panels show."""
    style.apply()
    order = {"small": 0, "medium": 1}
    sizes = sorted(dict.fromkeys(traj["size"]), key=lambda s: order.get(s, 9))
    fig, axes = plt.subplots(1, len(sizes), figsize=(style.FULL_WIDTH, 2.3), sharey=True, squeeze=False)
    regimes = list(dict.fromkeys(zip(traj["dtype"], traj["eps"].astype(float), strict=True)))
    for ax, size in zip(axes[0], sizes, strict=True):
        g = traj[traj["size"] == size]
        for i, (dtype, eps) in enumerate(regimes):
            h = g[(g["dtype"] == dtype) & np.isclose(g["eps"], eps, rtol=1e-9, atol=0)]
            if h.empty:
                continue
            # one line per regime (the median over seeds and layers) and a band (their range): the
            # runs of one regime overlap, and one line each would make the panel unreadable
            drift = h.assign(drift=h["drift_b_k"].clip(lower=1e-9)).groupby("step")["drift"]
            spread = drift.agg(["median", "min", "max"])
            color = style.OKABE_ITO[i % 8]
            # the short bfloat16 runs are drawn on top: under the float32 lines they vanish
            z = 3 if dtype == "bfloat16" else 2
            ax.fill_between(spread.index, spread["min"], spread["max"], color=color, alpha=0.25, lw=0, zorder=z)
            ax.loglog(spread.index, spread["median"], color=color, lw=1.1, zorder=z,
                      label=_regime(dtype, eps) if size == sizes[0] else None)
        ref = g[(g["dtype"] == "float32") & np.isclose(g["eps"], 1e-12, rtol=1e-9, atol=0)]
        t_end = float(ref["step"].max())
        d_end = float(ref.loc[ref["step"] == t_end, "drift_b_k"].median())
        ts = np.geomspace(t_end / 10, t_end, 10)
        for power, ls in ((0.5, ":"), (1.0, "--")):
            ax.loglog(ts, d_end * (ts / t_end) ** power / 1.6, color="0.3", lw=0.8, ls=ls,
                      label=rf"$\propto t^{{{power:g}}}$" if size == sizes[0] else None)
        layers, embed = int(g["num_layers"].iloc[0]), int(g["embed_dim"].iloc[0])
        ax.set(xlabel="step", title=f"{size}: {layers} layer{'s' if layers > 1 else ''}, E = {embed}")
    axes[0][0].set_ylabel(r"drift $\|b_k(t)-b_k(0)\|$")
    style.legend_outside(fig, ncol=5)
    fig.tight_layout()
    caption = full_drift_caption(intervals)
    return fig, caption


def full_drift_caption(intervals: pd.DataFrame) -> str:
    """One sentence per size: the exponent's mean over seeds and its 95% interval per regime."""
    parts = []
    for size, g in intervals[intervals["column"] == "exponent"].groupby("size", sort=False):
        cells = [f"{_regime(r['dtype'], r['eps'])} {r['mean']:.2f} [{r['low']:.2f}, {r['high']:.2f}]"
                 for _, r in g.iterrows()]
        parts.append(f"{size} model: " + "; ".join(cells))
    seeds = int(intervals["seeds"].max())
    return ("Drift of the key bias: per regime, the median over seeds and layers (line) and their range (band). "
            "Growth exponent over the "
            f"last decade, mean over {seeds} seeds with its 95% interval across seeds: " + ". ".join(parts) + ". "
            "Dotted: slope 1/2 (a walk); dashed: slope 1 (constant velocity).")


def plot_explanation(traj: pd.DataFrame, units: pd.DataFrame):
    """Left: sigma (RMS of b_k's gradient) against ||b_k|| along the float32 runs of the small model
    (the candidate explanation predicts slope 1 once ||b_k|| ~ ||k||). Right: the drift velocity
    measured over the last decade against the velocity Adam makes of the measured gradient bias.
    Returns (figure, caption)."""
    style.apply()
    fig, axes = plt.subplots(1, 2, figsize=(style.FULL_WIDTH, 2.5))
    ax = axes[0]
    small = traj[(traj["size"] == "small") & (traj["dtype"] == "float32")]
    for i, (eps, g) in enumerate(small.groupby("eps", sort=True)):
        for j, (_, run) in enumerate(g.groupby("seed")):
            late = run[run["step"] >= run["step"].max() / 10]
            ax.loglog(late["norm_b_k"], late["grad_rms_b_k"], ".", ms=1.5, color=style.OKABE_ITO[i + 1],
                      label=_regime("float32", eps) if j == 0 else None)
    late_all = small[small["step"] >= small.groupby(["eps", "seed"])["step"].transform("max") / 10]
    x_mid, y_mid = float(late_all["norm_b_k"].median()), float(late_all["grad_rms_b_k"].median())
    x = np.geomspace(x_mid / 3, x_mid * 3, 5)
    ax.loglog(x, y_mid * x / x_mid, color="0.3", lw=0.8, ls="--", label="slope 1")
    ax.set(xlabel=r"$\|b_k\|$", ylabel=r"RMS of $b_k$'s gradient $\sigma$", title="last decade, small model")
    ax.legend(fontsize=7, frameon=False, loc="upper left")
    ax = axes[1]
    f32 = units[units["dtype"] == "float32"]
    markers = {"small": "o", "medium": "s"}
    for i, (eps, g) in enumerate(f32.groupby("eps", sort=True)):
        for size, h in g.groupby("size", sort=False):
            ax.loglog(h["velocity_predicted"].clip(lower=1e-4), h["velocity_measured"].clip(lower=1e-4),
                      markers.get(size, "^"), ms=4, color=style.OKABE_ITO[i + 1], label=f"{size}, {_regime('float32', eps)}")
    lo = float(np.nanmin(f32[["velocity_predicted", "velocity_measured"]].clip(lower=1e-4).to_numpy())) / 1.5
    hi = float(np.nanmax(f32[["velocity_predicted", "velocity_measured"]].to_numpy())) * 1.5
    ax.loglog([lo, hi], [lo, hi], color="0.3", lw=0.8, ls="--")
    ax.set(xlabel=r"predicted: gradient bias $\times\,\sigma/(\sigma+\epsilon)$",
           ylabel="measured velocity (lr per step)", title="drift velocity, last decade")
    ax.legend(fontsize=7, frameon=False, loc="upper left")
    fig.tight_layout()
    return fig, explanation_caption(units)


def explanation_caption(units: pd.DataFrame) -> str:
    small = units[(units["size"] == "small") & (units["dtype"] == "float32")]
    el = small["noise_elasticity"]
    ratio = small["velocity_measured"] / small["velocity_predicted"]
    median = float(el.median())
    follows = ("hardly follows ||b_k||" if median < 0.25 else "follows ||b_k|| less than proportionally"
               if median < 0.75 else "follows ||b_k|| about proportionally")
    return (f"Left: along the small model's float32 runs sigma {follows} (log-log slope "
            f"{el.min():.2f} to {el.max():.2f} over the last decade, median {median:.2f}; the candidate explanation "
            "predicts about 1). "
            f"Right: the measured drift velocity against the velocity Adam makes of the gradient's measured bias "
            f"along the drift; in the small model their ratio lies between {ratio.min():.2f} and {ratio.max():.2f}.")


def _num(x, digits=2) -> str:
    return "$" + format_number(float(x), digits) + "$" if math.isfinite(float(x)) else "--"


def full_table_latex(units: pd.DataFrame) -> str:
    """Per recorded run (seed) and size and regime, layers averaged: exponent, step rate, noise
    elasticity, gradient bias along the drift, measured and predicted velocity, final drift."""
    cols = ["exponent", "step_rate", "noise_elasticity", "grad_along_drift", "velocity_measured",
            "velocity_predicted", "drift_end", "bk_over_key_end"]
    g = units.groupby(["size", "dtype", "eps", "seed"], sort=False)[cols].mean().reset_index()
    # short heads and regimes, so that the table fits the line unscaled; the caption spells each out
    header = ["size", r"dtype, $\varepsilon$", "seed", r"$\alpha$", r"$\kappa$", "elasticity",
              r"$\mu/\sigma$", "velocity", "predicted", "drift", r"$\|b_k\|/\|k\|_{\mathrm{typ}}$"]
    lines = [r"\begin{tabular}{lllrrrrrrrr}", r"\toprule", " & ".join(header) + r" \\", r"\midrule"]
    for _, r in g.iterrows():
        cells = [str(r["size"]), rf"{r['dtype']}, $10^{{{int(round(math.log10(float(r['eps']))))}}}$",
                 str(int(r["seed"]))]
        cells += [_num(r[c]) for c in cols]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)


def exponent_list_markdown(units: pd.DataFrame, spans: pd.DataFrame) -> str:
    """The exponent per size and regime (mean, interval across seeds, each seed's value) as a list."""
    lines = []
    for _, r in spans[spans["column"] == "exponent"].iterrows():
        sel = judge_full._select(units, dtype=r["dtype"], eps=r["eps"], size=r["size"])
        seeds = judge_full.per_seed(sel, "exponent")
        each = ", ".join(f"{int(s)}: {v:.2f}" for s, v in zip(seeds["seed"], seeds["exponent"], strict=True))
        lines.append(f"- {r['size']}, {_regime(r['dtype'], r['eps'])}: **{r['mean']:.2f}** "
                     f"[{r['low']:.2f}, {r['high']:.2f}] (seeds {each})")
    return ("Growth exponent per size and regime (mean over seeds, 95% interval across seeds, then each seed):\n\n"
            + "\n".join(lines))


def rate_list_markdown(spans: pd.DataFrame) -> str:
    """Adam's step rate per size and regime: mean over seeds and the seeds' range."""
    return "\n".join(f"- {r['size']}, {_regime(r['dtype'], r['eps'])}: step rate r = {r['mean']:.3g} "
                     f"(seeds {r['min']:.3g} to {r['max']:.3g}), a step of about {math.sqrt(max(r['mean'], 0)):.2g} "
                     "of full size" for _, r in spans[spans["column"] == "step_rate"].iterrows())


def build_run_markdown(build: dict, full: dict, *, seed: int, steps: int, bound: float) -> str:
    """The long run made on this page against the recorded grid, in words."""
    same = ("the same way as" if (build["LongExponent"] > bound) == (full["LongFullExponentMedianSmall"] > bound)
            else "differently from")
    return (f"The long run made here (seed {seed}, {steps:,} steps) grows with exponent {build['LongExponent']:.2f} "
            f"(within-run interval {build['LongExponentLow']:.2f} to {build['LongExponentHigh']:.2f}): "
            f"{build['LongDriftVerdict']}, pointing {same} the recorded grid. The walk law predicts a drift of "
            f"{build['LongDriftPredictedEnd']:.3g} at the end; the run drifted {build['LongDriftMeasuredEnd']:.3g} "
            f"(within a factor {build['LongDriftMaxFactor']:.1f} of the law beyond the grid's length). At its end "
            f"||b_k|| / ||k|| = {build['LongBkOverKeyEnd']:.2f}; nothing is extrapolated beyond the measured steps.")


# ----------------------------------------------------------------------------- the page's words
# Each caption and sentence below is computed from the frame that the figure or the claim reads,
# so a page cannot say something its numbers contradict.

FULL_DRIFT_ALT = ("Log-log panels, one per model size: the drift of the key bias against the training step, one "
                  "line per seed and layer, coloured by Adam regime, with reference lines of slope 1/2 and 1.")
EXPLANATION_ALT = ("Left: log-log scatter of the RMS of the key bias's gradient against the key bias's norm along "
                   "the small model's float32 runs, beside a slope-1 line. Right: measured drift velocity against "
                   "the velocity predicted from the gradient's bias, one marker per run, beside the diagonal.")
BUILD_DRIFT_ALT = ("Left: log-log lines of the key bias's drift against the step in the short grid run here, one "
                   "per dtype and eps. Right: the long run made here, per layer: measured drift (solid), the walk "
                   "law's prediction (dashed) and the typical key norm (dotted), with a vertical line at the grid's "
                   "length.")
OUTPUT_ERROR_ALT = ("Log-log scatter, one marker per probe and layer: the measured RMS change of the attention "
                    "output caused by the key bias against the change the rounding law predicts, beside the "
                    "diagonal.")


def _n(value, digits: int = 3) -> str:
    return tables.format_number(float(value), digits)


def _times(ratio: float) -> str:
    """'2.3 times' or '0.43 of'; a ratio within 5% of 1 is 'about equal to'."""
    if abs(ratio - 1) < 0.05:
        return "about equal to"
    return f"{_n(ratio, 2)} times" if ratio > 1 else f"{_n(ratio, 2)} of"


def exponent_frame(units: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """The growth exponent per size and regime as a reader's table: mean over seeds, its 95% interval
    across seeds, and each seed's value."""
    rows = []
    for _, r in spans[spans["column"] == "exponent"].iterrows():
        sel = judge_full._select(units, dtype=r["dtype"], eps=r["eps"], size=r["size"])
        seeds = judge_full.per_seed(sel, "exponent")
        rows.append({"size": r["size"], "regime": _regime(r["dtype"], r["eps"]),
                     "exponent, mean over seeds": round(float(r["mean"]), 2),
                     "95% interval across seeds": f"{r['low']:.2f} to {r['high']:.2f}",
                     "each seed": ", ".join(f"{v:.2f}" for v in seeds["exponent"])})
    return pd.DataFrame(rows)


def rate_frame(spans: pd.DataFrame) -> pd.DataFrame:
    """Adam's step rate r per size and regime (mean over seeds and the seeds' range), with the step's
    size as a share of a full step (about sqrt r)."""
    rows = []
    for _, r in spans[spans["column"] == "step_rate"].iterrows():
        rows.append({"size": r["size"], "regime": _regime(r["dtype"], r["eps"]), "step rate r": float(r["mean"]),
                     "smallest over seeds": float(r["min"]), "largest over seeds": float(r["max"]),
                     "step over a full step": math.sqrt(max(float(r["mean"]), 0.0))})
    return pd.DataFrame(rows)


def failed_prediction_text(prediction: dict) -> str:
    """A prediction registered before the runs, judged as registered, in words."""
    outcome = "held" if prediction["holds"] else "failed"
    return (f"One prediction, registered before the grid ran, {outcome}: {prediction['statement']} "
            f"The runs measured {_n(prediction['value'])} against the bound {_n(prediction['bound'])}, so it is "
            "reported here and is no longer a claim.")


def regimes_text(claims) -> str:
    """Section 4's finding from the values of its claims (keyed by claim id)."""
    v = {c.id: float(c.value) for c in claims}
    return (f"With eps = 1e-12 in float32 the step rate of every layer in every run is at least "
            f"{_n(v['adam-full-steps-float32-small-eps'])}, and with the default eps in bfloat16 at least "
            f"{_n(v['adam-full-steps-bfloat16-default-eps'])} (the table averages a run's layers): "
            "full-size steps on rounding noise. In float32 at the default eps it is at most "
            f"{_n(v['adam-sgd-steps-float32-default-eps'])}, steps of at most "
            f"{_n(math.sqrt(v['adam-sgd-steps-float32-default-eps']), 2)} of full size, and at the end the drift is at "
            f"most {_n(v['adam-default-eps-damps-drift'])} of the same seed's drift with eps = 1e-12. The same "
            f"ratio for bfloat16, whose steps are full-size again, is at least "
            f"{_n(v['adam-drift-ratio-control-bfloat16'], 2)}: the comparison sees a regime of full steps.")


def build_drift_caption(comparison: pd.DataFrame) -> str:
    """Figure caption for `plot_drift`: the long run's drift against the law at its end, and the
    largest departure beyond the grid's length, both from `comparison`."""
    end_step = int(comparison["step"].max())
    end = comparison[comparison["step"] == end_step]
    measured, predicted = float(end["drift_b_k"].mean()), float(end["predicted_drift"].mean())
    grid_steps = int(comparison["grid_steps"].iloc[0])
    beyond = comparison[comparison["step"] > grid_steps]
    ratio = (beyond["drift_b_k"] / beyond["predicted_drift"]).replace([np.inf, -np.inf], np.nan).dropna()
    far = ""
    if len(ratio):
        far = (f" Beyond the grid's {grid_steps:,} steps (vertical line) the measured drift is between "
               f"{_n(ratio.min(), 2)} and {_n(ratio.max(), 2)} times the prediction.")
    return ("Left: drift of b_k in the short grid run here, per dtype and eps, mean over seeds and layers. Right: "
            "the long run's drift (solid), the walk law's prediction from the short grid (dashed) and the typical "
            f"key norm ||k|| (dotted). At step {end_step:,} the drift is {_n(measured)}, {_times(measured / predicted)} "
            f"the predicted {_n(predicted)}." + far)


def output_error_caption(probes: pd.DataFrame) -> str:
    """Figure caption for `plot_output_error`, from the probes it plots."""
    g = probes[probes["step"] > 0]
    ratio = (g["output_change_rms"] / g["predicted_change_rms"]).replace([np.inf, -np.inf], np.nan).dropna()
    last = g[g["step"] == g["step"].max()]
    measured, predicted = float(last["output_change_rms"].max()), float(last["predicted_change_rms"].max())
    bk_over_k = float((last["norm_b_k"] / last["key_norm"]).max())
    return ("The attention-output change that b_k causes in the long run made here, one marker per probe and layer, "
            f"against notebook 03's rounding law: across the probes the measured change is {_n(ratio.min(), 2)} to "
            f"{_n(ratio.max(), 2)} times the predicted one. At the last probe (step {int(last['step'].max()):,}) it is "
            f"{_n(measured, 2)} against a predicted {_n(predicted, 2)}, with ||b_k|| / ||k|| = {_n(bk_over_k)}.")
