"""Notebook 03, shown: its figures (keybias.studies.style, full width) and LaTeX tables."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from keybias.core.recorder import latex_escape
from keybias.studies import style
from keybias.studies.precision.judge import CROSSING_FACTOR
from keybias.studies.precision.measure import PATHS
from keybias.studies.style import OKABE_ITO

PATH_LABELS = {
    "explicit": "written out",
    "sdpa_math": "SDPA math",
    "sdpa_flash": "SDPA flash",
    "sdpa_efficient": "SDPA memory-efficient",
    "mha": "nn.MultiheadAttention",
}


def path_label(path: str) -> str:
    """The code path in words, for legends and tables."""
    return PATH_LABELS.get(path, path)


def _path_colors() -> dict[str, str]:
    """One Okabe-Ito colour per code path, the same in every panel and figure."""
    return {path: OKABE_ITO[i] for i, path in enumerate(PATHS)}


def plot_error_vs_bias(errors: pd.DataFrame, law: pd.DataFrame, dtypes):
    """One panel per dtype: RMS change y(b_k) - y(0) per path (markers), with each path's fitted
    law over its fitted range (dashed, in the path's colour: one series with its markers) and the
    rounding model (thin black). The verdict tolerances are not drawn: they doubled the lines of every
    panel. Returns the figure, made at the paper's full width with the
    keybias style (call `keybias.studies.style.apply()` first)."""
    colors = _path_colors()
    ok = errors[errors["status"].eq("ok")]
    rows = math.ceil(len(dtypes) / 2)
    fig, axes = plt.subplots(rows, 2, figsize=(style.FULL_WIDTH, 2.3 * rows), sharex=True, squeeze=False)
    for ax, dtype in zip(axes.flat, dtypes, strict=False):
        model_drawn = set()
        for path, g in ok[ok["dtype"].eq(dtype)].groupby("path", sort=False):
            color = colors[path]
            ax.loglog(g["ratio"], g["delta_rms"], "o", ms=3, color=color, label=path_label(path))
            f = law[(law["dtype"] == dtype) & (law["path"] == path)] if len(law) else law
            if len(f) and np.isfinite(f["slope"].iloc[0]):
                r = np.geomspace(f["ratio_min"].iloc[0], f["ratio_max"].iloc[0], 20)
                ax.loglog(r, f["const"].iloc[0] * r ** f["slope"].iloc[0], "--", color=color, lw=1)
            family = "mha" if path == "mha" else "core"  # the model differs only between these
            if family not in model_drawn:
                model_drawn.add(family)
                ax.loglog(g["ratio"], g["pred_rms"], "-", color=style.OKABE_ITO[7], lw=0.6)
        ax.set_title(dtype)
        ax.set_ylabel("RMS output change")
    for ax in axes.flat[len(dtypes):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel(r"$\|b_k\| / \|k\|_{\mathrm{typ}}$")
    handles = [plt.Line2D([], [], color=colors[p], marker="o", ls="", ms=3, label=path_label(p))
               for p in PATHS if p in set(ok["path"])]
    handles += [plt.Line2D([], [], color=style.OKABE_ITO[7], lw=0.6, label="rounding model")]
    fig.tight_layout()
    style.legend_outside(fig, handles=handles, ncol=min(len(handles), 3))
    return fig


def plot_accuracy(errors: pd.DataFrame, crossing: pd.DataFrame, dtypes, factor: float = CROSSING_FACTOR):
    """One panel per dtype below float64: error against float64 with b_k over the error
    without it, per path, at each magnitude, with the level `factor` (dashed) and the
    measured crossings (dotted). Returns the figure (None if only float64 ran)."""
    colors = _path_colors()
    ok = errors[errors["status"].eq("ok")]
    low = [d for d in dtypes if d != "float64"]
    if not low:
        return None
    fig, axes = plt.subplots(1, len(low), figsize=(style.FULL_WIDTH, 2.4), sharey=True, squeeze=False)
    for ax, dtype in zip(axes[0], low, strict=True):
        for path, g in ok[ok["dtype"].eq(dtype)].groupby("path", sort=False):
            ax.loglog(g["ratio"], g["err_rms"] / g["err0_rms"], "o-", ms=2.5, lw=0.8, color=colors[path],
                      label=path_label(path))
            c = crossing[(crossing["dtype"] == dtype) & (crossing["path"] == path)]["crossing"]
            if len(c) and np.isfinite(c.iloc[0]):
                ax.axvline(c.iloc[0], color=colors[path], lw=0.6, ls=":")
        ax.axhline(factor, color="0", lw=0.8, ls="--")
        ax.set_title(dtype)
        ax.set_xlabel(r"$\|b_k\| / \|k\|_{\mathrm{typ}}$")
    axes[0][0].set_ylabel("error with $b_k$ / without")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.tight_layout()
    style.legend_outside(fig, handles=handles, labels=labels, ncol=len(labels))
    return fig


def plot_gradient(gsum: pd.DataFrame):
    """Left: |g_bk|/|g_bq| against u per path, with the line u. Right: per dtype, the mean
    pairwise cosine across batches of the b_k gradients (filled) and of the b_q gradients
    (open), one point per path, with the band that isotropic noise reaches (grey). Returns the
    figure."""
    colors = _path_colors()
    okg = gsum[gsum["status"].eq("ok")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(style.FULL_WIDTH, 2.35))
    for path, g in okg.groupby("path", sort=False):
        ax1.loglog(g["unit_roundoff"], g["ratio_median"], "o", ms=3.5, color=colors[path], label=path_label(path))
    u = np.array(sorted(okg["unit_roundoff"].unique()))
    ax1.loglog(u, u, "--", color="0", lw=0.8, label="$u$")
    ax1.set_xlabel("unit roundoff $u$ of the dtype")
    # one label every four decades: at every other decade the labels of this narrow panel overlap
    ax1.xaxis.set_major_locator(plt.LogLocator(base=10.0 ** 4))
    ax1.xaxis.set_minor_locator(plt.NullLocator())
    ax1.set_ylabel(r"$\|g_{b_k}\| / \|g_{b_q}\|$")
    ax1.set_title("size")
    dtypes = list(dict.fromkeys(okg["dtype"]))
    paths = [p for p in PATHS if p in set(okg["path"])]
    offset = {p: (i - (len(paths) - 1) / 2) * 0.14 for i, p in enumerate(paths)}
    for i, dtype in enumerate(dtypes):
        d = okg[okg["dtype"] == dtype]
        bound = float(d["cos_bound"].max())
        ax2.fill_between([i - 0.35, i + 0.35], -bound, bound, color="0.88", lw=0,
                         label="reach of isotropic noise" if i == 0 else None)
        for _, r in d.iterrows():
            x = i + offset[r["path"]]
            ax2.plot(x, r["bk_mean_cos"], "o", ms=4, color=colors[r["path"]])
            ax2.plot(x, r["bq_mean_cos"], "o", ms=4, mfc="none", mec=colors[r["path"]], mew=0.9)
    ax2.plot([], [], "o", ms=4, color="0.3", label="$b_k$ gradients")
    ax2.plot([], [], "o", ms=4, mfc="none", mec="0.3", label="$b_q$ gradients")
    ax2.axhline(0.0, color="0.5", lw=0.5)
    ax2.set_xticks(range(len(dtypes)), dtypes)
    ax2.set_ylabel("mean pairwise cosine")
    ax2.set_title("direction across batches")
    fig.tight_layout()
    # one legend above both panels: the paths and u (left), the markers and the band (right)
    h1, l1 = ax1.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    style.legend_outside(fig, handles=h1 + h2, labels=l1 + l2, ncol=min(len(l1 + l2), 5))
    return fig


def gradient_table_with_devices(gsum: pd.DataFrame, absent: pd.DataFrame) -> str:
    """`gradient_table` of the measured rows plus one not-run row per absent device."""
    return gradient_table(pd.concat([gsum, absent.assign(dtype="all", path="all")], ignore_index=True))


def law_table(law: pd.DataFrame) -> str:
    """The fitted law per dtype and path as a LaTeX tabular body (booktabs)."""
    frame = pd.DataFrame({
        "dtype": law["dtype"], "path": law["path"].map(path_label).map(latex_escape), "points": law["points"],
        "slope": [f"${s:.3f} \\pm {e:.3f}$" for s, e in zip(law["slope"], law["slope_se"], strict=True)],
        "$A/u$": [f"{c:.3g}" for c in law["const_over_u"]],
        "$C$ (model)": [f"{c:.2f}" for c in law["model_constant"]],
        "resid. (dex)": [f"{r:.3f}" for r in law["resid_log10"]],
    })
    return frame.to_latex(index=False, escape=False)


def _reason_words(device: str, reason: str) -> str:
    """Why a row was not run, for a reader: no exception class names, no "this machine"."""
    if "not present" in reason:
        if device == "cuda":
            return "measured on the GPU (APPENDIX)"
        return f"no {device.upper()} device available"
    if "no cpu kernel" in reason.lower():
        return "no CPU kernel for this dtype"
    return reason.split(" (")[0]


def gradient_table(gsum: pd.DataFrame) -> str:
    """Gradient summary per dtype and path as a LaTeX tabular body; not-run rows keep their
    reason."""
    rows = []
    for _, r in gsum.iterrows():
        base = {"device": r["device"], "dtype": r["dtype"], "path": latex_escape(path_label(r["path"]))}
        if r["status"] != "ok":
            reason = latex_escape(_reason_words(r["device"], str(r["reason"]))).replace(
                "APPENDIX", r"Appendix~\ref{sec:gpu}")
            rows.append({**base, "ratio": "not measured", "cos_k": "", "cos_q": "", "bound": reason})
            continue
        rows.append({**base, "ratio": f"{r['ratio_over_u']:.3f}", "cos_k": f"{r['bk_mean_cos']:+.3f}",
                     "cos_q": f"{r['bq_mean_cos']:.2f}", "bound": f"{r['cos_bound']:.3f}"})
    frame = pd.DataFrame(rows).rename(columns={
        "ratio": r"$\|g_{b_k}\|/(u\|g_{b_q}\|)$", "cos_k": r"$\cos b_k$", "cos_q": r"$\cos b_q$",
        "bound": "noise bound, or why not measured"})
    return frame.to_latex(index=False, escape=False)
