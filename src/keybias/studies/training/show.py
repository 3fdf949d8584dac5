"""Training dynamics of the key bias: show (figures from `keybias.studies.training.measure`'s frames)."""

from __future__ import annotations

import pandas as pd

from keybias.studies import style
from keybias.studies.training.measure import OPTIMIZER_LABELS


def plot_bias_norms(trajectories: pd.DataFrame, seed: int | None = None):
    """Left: ||b_k|| (all layers) against the step per setting, with ||b_q|| and ||b_v|| of the
    first SGD and first Adam setting for scale. Right: the drift ||b_k(t) - b_k(0)||, log axis."""
    import matplotlib.pyplot as plt

    style.apply()
    seed = int(trajectories["seed"].iloc[0]) if seed is None else seed
    data = trajectories[trajectories["seed"] == seed]
    labels = list(dict.fromkeys(data["setting"]))
    fig, axes = plt.subplots(1, 2, figsize=(style.FULL_WIDTH, 2.8))
    styles = ["-", "--", "-.", ":"]
    for i, label in enumerate(labels):
        g = data[data["setting"] == label]
        color, ls = style.OKABE_ITO[i % 7], styles[(i // 7) % 4]
        axes[0].plot(g["step"], g["norm_b_k"], color=color, ls=ls, lw=1.1, label=label)
        axes[1].semilogy(g["step"].iloc[1:], g["drift_b_k"].iloc[1:].clip(lower=1e-12), color=color, ls=ls, lw=1.1)
    for opt, ls in (("sgd", "--"), ("adam", ":")):
        runs = data[data["optimizer"] == opt]
        if len(runs):
            first = runs[runs["setting"] == runs["setting"].iloc[0]]
            axes[0].plot(first["step"], first["norm_b_q"], color="0.45", ls=ls, lw=0.8,
                         label=f"||b_q|| ({OPTIMIZER_LABELS[opt]})")
            axes[0].plot(first["step"], first["norm_b_v"], color="0.7", ls=ls, lw=0.8,
                         label=f"||b_v|| ({OPTIMIZER_LABELS[opt]})")
    axes[0].set(xlabel="step", ylabel="norm over all layers", title=f"bias norms (seed {seed})")
    axes[1].set(xlabel="step", ylabel=r"$\|b_k(t)-b_k(0)\|$", title=r"drift of $b_k$")
    style.legend_outside(fig, ncol=3)
    fig.tight_layout()
    return fig


def plot_curves(curves: pd.DataFrame):
    """Per optimizer (rows): training loss and test accuracy with b_k kept and removed (seeds
    overlaid), and the relative parameter distance from the removed model of the kept model and
    of the two one-ulp controls (up and down)."""
    import matplotlib.pyplot as plt

    style.apply()
    opts = list(dict.fromkeys(curves["optimizer"]))
    fig, axes = plt.subplots(len(opts), 3, figsize=(style.FULL_WIDTH, 1.9 * len(opts) + 0.5), squeeze=False)
    blue, orange, green = style.OKABE_ITO[0], style.OKABE_ITO[1], style.OKABE_ITO[2]
    for r, opt in enumerate(opts):
        for seed, g in curves[curves["optimizer"] == opt].groupby("seed"):
            ev = g.dropna(subset=["test_acc_removed"])
            first = r == 0 and seed == curves["seed"].min()
            axes[r, 0].plot(g["step"], g["loss_removed"], color=blue, lw=1.4, label="b_k removed" if first else None)
            axes[r, 0].plot(g["step"], g["loss_kept"], color=orange, lw=0.9, ls="--",
                            label="b_k kept" if first else None)
            axes[r, 1].plot(ev["step"], ev["test_acc_removed"], "o-", color=blue, ms=2.5)
            axes[r, 1].plot(ev["step"], ev["test_acc_kept"], "x--", color=orange, ms=3)
            axes[r, 2].semilogy(g["step"], g["param_divergence_kept"].clip(lower=1e-12), color=orange, lw=0.9)
            axes[r, 2].semilogy(g["step"], g["param_divergence_control"].clip(lower=1e-12), color=green, ls=":",
                                label="1-ulp controls (up, down) vs removed" if first else None)
            if "param_divergence_control_down" in g:
                axes[r, 2].semilogy(g["step"], g["param_divergence_control_down"].clip(lower=1e-12), color=green,
                                    ls="-.", lw=0.8)
        name = OPTIMIZER_LABELS[opt]
        axes[r, 0].set(xlabel="step", ylabel="training loss", title=f"{name}: loss")
        axes[r, 1].set(xlabel="step", ylabel="test accuracy", title=f"{name}: accuracy")
        axes[r, 2].set(xlabel="step", ylabel="rel. distance", title=f"{name}: divergence")
    style.legend_outside(fig, ncol=3)
    fig.tight_layout()
    return fig
