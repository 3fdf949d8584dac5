"""Training dynamics of the key bias: show (figures from `keybias.studies.training.measure`'s frames)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from keybias.studies import style
from keybias.studies.training.measure import OPTIMIZER_LABELS

_ZERO_FLOOR = 1e-13  # a drift of exactly zero (every update rounded away) is drawn on this line, labelled 0


def _setting_words(optimizer: str, eps: float, dtype: str, weight_decay: float) -> str:
    """A legend entry a reader can parse: the optimizer's epsilon and dtype in words."""
    exp = int(round(np.log10(eps))) if eps > 0 else None
    words = []
    if optimizer in ("adam", "adamw", "adamw_bias_decay"):
        words.append(rf"$\varepsilon=10^{{{exp}}}$")
    if optimizer == "sgd_momentum":
        words.append("with momentum")
    if optimizer == "adamw":
        words = ["decay on weights only"]
    if optimizer == "adamw_bias_decay":
        words = ["decay on weights and biases"]
    if optimizer == "sgd":
        words.append("plain")
    if dtype != "float32":  # float32 unless marked (the caption says so)
        words.append(f"{dtype} autocast")
    return ", ".join(words)


# the three panels of the bias-norm figure: which optimizers each holds, and its title
_FAMILIES = (
    (("sgd", "sgd_momentum"), "SGD"),
    (("adam",), "Adam"),
    (("adamw", "adamw_bias_decay"), "AdamW (weight decay {wd:g})"),
)


def plot_bias_norms(trajectories: pd.DataFrame, seed: int | None = None):
    """The drift ||b_k(t) - b_k(0)|| (all layers, log axis) against the step, one panel per
    optimizer family (SGD, Adam, AdamW) with at most five series each, and the norm ||b_q(t)||
    of the same run (grey; b_q starts at zero, so this is its drift) for scale. A drift of
    exactly zero is drawn on the bottom line (`_ZERO_FLOOR`)."""
    style.apply()
    seed = int(trajectories["seed"].iloc[0]) if seed is None else seed
    data = trajectories[trajectories["seed"] == seed]
    panels = [(opts, title) for opts, title in _FAMILIES if data["optimizer"].isin(opts).any()]
    fig, axes = plt.subplots(1, len(panels), figsize=(style.FULL_WIDTH, 3.1), sharey=True, squeeze=False)
    for ax, (opts, title) in zip(axes[0], panels, strict=True):
        sub = data[data["optimizer"].isin(opts)]
        keys = list(dict.fromkeys(zip(sub["optimizer"], sub["eps"], sub["dtype"], sub["weight_decay"], strict=True)))
        keys.sort(key=lambda k: (opts.index(k[0]), k[2] != "float32", -k[1]))
        for i, (opt, eps, dtype, wd) in enumerate(keys):
            g = sub[(sub["optimizer"] == opt) & (sub["eps"] == eps) & (sub["dtype"] == dtype)]
            ls = "--" if dtype == "bfloat16" else "-"
            ax.semilogy(g["step"].iloc[1:], g["drift_b_k"].iloc[1:].clip(lower=_ZERO_FLOOR),
                        color=style.OKABE_ITO[i], ls=ls, lw=1.2, label=_setting_words(opt, eps, dtype, wd))
        ref = sub[(sub["optimizer"] == keys[0][0]) & (sub["eps"] == keys[0][1]) & (sub["dtype"] == keys[0][2])]
        ax.semilogy(ref["step"].iloc[1:], ref["norm_b_q"].iloc[1:], color="0.55", lw=0.9, ls=":",
                    label=r"$\|b_q(t)\|$, for scale")
        wd = float(sub.loc[sub["optimizer"].isin(("adamw", "adamw_bias_decay")), "weight_decay"].max()) \
            if "{wd" in title else 0.0
        ax.set_title(title.format(wd=wd))
        ax.set_xlabel("training step")
        ax.set_xticks([0, 50, 100, 150] if data["step"].max() >= 150 else ax.get_xticks())
        ax.set_xlim(0, data["step"].max())
        ax.legend(loc="upper left", bbox_to_anchor=(-0.04, -0.3), frameon=False, handlelength=2.0,
                  borderaxespad=0.0, labelspacing=0.25)
    axes[0][0].set_ylabel(r"drift $\|b_k(t)-b_k(0)\|$")
    axes[0][0].set_ylim(_ZERO_FLOOR / 3, 3.0)
    ticks = [_ZERO_FLOOR] + [10.0**e for e in (-10, -7, -4, -1)]
    axes[0][0].set_yticks(ticks, ["0"] + [f"$10^{{{e}}}$" for e in (-10, -7, -4, -1)])
    axes[0][0].minorticks_off()
    fig.subplots_adjust(left=0.115, right=0.975, top=0.92, bottom=0.53, wspace=0.12)
    return fig


def plot_curves(curves: pd.DataFrame):
    """Per optimizer (rows): training loss and test accuracy with b_k kept and removed (seeds
    overlaid), and the relative parameter distance from the removed model of the kept model and
    of the two one-ulp controls (up and down)."""
    style.apply()
    opts = list(dict.fromkeys(curves["optimizer"]))
    fig, axes = plt.subplots(len(opts), 3, figsize=(style.FULL_WIDTH, 1.9 * len(opts) + 0.5), squeeze=False)
    blue, orange, green = style.OKABE_ITO[0], style.OKABE_ITO[1], style.OKABE_ITO[2]
    for r, opt in enumerate(opts):
        for seed, g in curves[curves["optimizer"] == opt].groupby("seed"):
            ev = g.dropna(subset=["test_acc_removed"])
            first = r == 0 and seed == curves["seed"].min()
            axes[r, 0].plot(g["step"], g["loss_removed"], color=blue, lw=1.4, label="$b_k$ removed" if first else None)
            axes[r, 0].plot(g["step"], g["loss_kept"], color=orange, lw=0.9, ls="--",
                            label="$b_k$ kept" if first else None)
            axes[r, 1].plot(ev["step"], ev["test_acc_removed"], "o-", color=blue, ms=2.5)
            axes[r, 1].plot(ev["step"], ev["test_acc_kept"], "x--", color=orange, ms=3)
            axes[r, 2].semilogy(g["step"], g["param_divergence_kept"].clip(lower=1e-12), color=orange, lw=0.9,
                                label="distance of kept from removed" if first else None)
            axes[r, 2].semilogy(g["step"], g["param_divergence_control"].clip(lower=1e-12), color=green, ls=":",
                                label="distance of one-ulp copies (up, down) from removed" if first else None)
            if "param_divergence_control_down" in g:
                axes[r, 2].semilogy(g["step"], g["param_divergence_control_down"].clip(lower=1e-12), color=green,
                                    ls="-.", lw=0.8)
        name = OPTIMIZER_LABELS[opt]
        axes[r, 0].set(xlabel="step", ylabel="training loss", title=f"{name}: loss")
        axes[r, 1].set(xlabel="step", ylabel="test accuracy", title=f"{name}: accuracy")
        axes[r, 2].set(xlabel="step", ylabel="relative parameter distance", title=f"{name}: divergence")
    fig.tight_layout()
    style.legend_outside(fig, ncol=4)
    return fig
