"""Showing the cost results: the paper's tables and the time-saving figure."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from keybias.studies import style
from keybias.studies.cost.judge import headline
from keybias.studies.cost.measure import device_status
from keybias.studies.cost.stats import LEVEL


def _thousands(n) -> str:
    return f"{int(n):,}".replace(",", "{,}")


def memory_latex(memory: pd.DataFrame) -> str:
    """The booktabs tabular of `memory_table` for the paper (counts with LaTeX thousands)."""
    lines = [r"\begin{tabular}{lrrrrrr}", r"\toprule",
             r"Architecture & $E$ & layers & parameters & $b_k$ & $b_k$ of attn.\ (\%) & $b_k$ of model (\%) \\",
             r"\midrule"]
    for r in memory.itertuples():
        lines.append(f"{r.architecture} & {r.embed_dim} & {r.layers} & {_thousands(r.model_params)} & "
                     f"{_thousands(r.bk_params)} & {100 * r.bk_fraction_of_attention_layer:.4f} & "
                     f"{100 * r.bk_fraction_of_model:.4f} \\\\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)


def _pct(x: float, digits: int = 2) -> str:
    return "--" if not math.isfinite(float(x)) else f"{100 * float(x):.{digits}f}"


def verdict_latex(table: pd.DataFrame) -> str:
    """One row per configuration: step time, saving with its interval, resolved or bounded, model."""
    lines = [r"\begin{tabular}{lllrrrrll}", r"\toprule",
             r"block & attention & pass & tokens & step (ms) & saving (\%) & interval (\%) & verdict & byte model (\%) \\",
             r"\midrule"]
    for r in table.itertuples():
        verdict = "resolved" if r.resolved else rf"$\le {_pct(r.saving_upper_bound)}$"
        lines.append(
            f"{r.block} & {r.attention} & {r.mode} & {int(r.seq_len)} & {1e3 * r.denominator_median_s:.1f} & "
            f"{_pct(r.measured_saving)} & [{_pct(r.saving_ci_low)}, {_pct(r.saving_ci_high)}] & {verdict} & "
            f"{_pct(r.predicted_saving, 3)} ({r.model_direction}) \\\\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)


def _label(r) -> str:
    return f"{r.block} {r.attention} {r.mode}, {int(r.seq_len)} tokens"


def time_saving_figure(model: pd.DataFrame, ratios: pd.DataFrame, *, device: str, threads: int):
    """Left: the saving per configuration with its LEVEL interval (thick), its Bonferroni
    interval (thin), the control's half-width (grey band) and the byte model (diamond).
    Right: the same for each phase of the training step (forward, backward, optimizer)."""
    style.apply()
    main = headline(model).reset_index(drop=True)
    ctrl = headline(ratios[ratios["ratio"] == "control"]).set_index(["block", "attention", "mode", "seq_len", "batch"])
    sub = model[(model["mode"] == "training") & (model["phase"] != "total")]
    height = max(2.8, 0.32 * len(main) + 1.6)  # room above the panels for their legends
    ncols = 2 if len(sub) else 1
    fig, axs = plt.subplots(1, ncols, figsize=(style.FULL_WIDTH, height), squeeze=False,
                            gridspec_kw={"width_ratios": [1.0, 0.8][:ncols]})
    ax = axs[0][0]
    y = np.arange(len(main))[::-1]
    for yi, r in zip(y, main.itertuples(), strict=True):
        hw = float(ctrl.loc[(r.block, r.attention, r.mode, r.seq_len, r.batch), "half_width"])
        ax.fill_betweenx([yi - 0.35, yi + 0.35], -100 * hw, 100 * hw, color="0.85", lw=0,
                         label="control half-width" if yi == y[0] else None)
        ax.plot([100 * r.saving_ci_low_adjusted, 100 * r.saving_ci_high_adjusted], [yi, yi], color=style.OKABE_ITO[0],
                lw=0.8, label="simultaneous interval" if yi == y[0] else None)
        ax.plot([100 * r.saving_ci_low, 100 * r.saving_ci_high], [yi, yi], color=style.OKABE_ITO[0], lw=3,
                label=f"{100 * LEVEL:g}% interval" if yi == y[0] else None)
        ax.plot(100 * r.measured_saving, yi, "o", color=style.OKABE_ITO[0], ms=4)
        ax.plot(100 * r.predicted_saving, yi, "D", color=style.OKABE_ITO[3], ms=4,
                label="byte model" if yi == y[0] else None)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(y, [_label(r) for r in main.itertuples()])
    ax.set_xlabel("saving from removing $b_k$ (% of the pass)")
    if ncols == 2:
        ax2 = axs[0][1]
        phases = ("forward", "backward", "step")
        keys = list(dict.fromkeys((r.block, r.attention, r.seq_len, r.batch) for r in sub.itertuples()))
        for k, phase in enumerate(phases):
            rows = sub[sub["phase"] == phase].set_index(["block", "attention", "seq_len", "batch"])
            for j, key in enumerate(keys):
                if key not in rows.index:
                    continue
                r = rows.loc[key]
                yj = len(keys) - 1 - j + (1 - k) * 0.22
                ax2.plot([100 * r.saving_ci_low, 100 * r.saving_ci_high], [yj, yj], color=style.OKABE_ITO[k + 1], lw=2.5,
                         label={"step": "optimizer step"}.get(phase, phase) if j == 0 else None)
                ax2.plot(100 * r.measured_saving, yj, "o", color=style.OKABE_ITO[k + 1], ms=3)
        ax2.axvline(0, color="k", lw=0.8)
        # the phases sit 0.22 above and below each row: without room the outer ones touch the frame
        ax2.set_ylim(-0.6, len(keys) - 0.4)
        ax2.margins(x=0.08)
        ax2.set_yticks(np.arange(len(keys))[::-1], [f"{b} {a}, {s} tokens" for b, a, s, _ in keys])
        ax2.set_xlabel("saving (% of the phase)")
        ax2.set_title("training step, by phase", loc="left")
    ax.set_title("whole pass", loc="left")
    # one legend over each panel, titled by the panel, so that no legend lists more than four entries;
    # tight_layout then makes room for them inside the figure's width
    for a in fig.axes:
        h, lab = a.get_legend_handles_labels()
        title = a.get_title(loc="left")
        a.set_title("", loc="left")
        if h:
            a.legend(h, lab, loc="lower left", bbox_to_anchor=(0.0, 1.02), ncol=2 if len(h) > 3 else 1,
                     borderaxespad=0.0, frameon=False, handlelength=1.5, columnspacing=1.0,
                     title=title, alignment="left")
    fig.tight_layout()
    return fig


def attention_words(attentions) -> str:
    """The attentions timed, in words for the paper."""
    names = {"self": "self-attention", "cross": "cross-attention to a separate memory of the same length"}
    if not attentions:
        raise ValueError("no attentions")
    words = [names[a] for a in attentions]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def cuda_sentence(device: str) -> str:
    """One sentence for the paper on the CUDA rows: measured on which GPU, or why not run."""
    if device == "cuda":
        return f"The same benchmark ran on a CUDA GPU ({torch.cuda.get_device_name(0)})."
    status = device_status(device).set_index("device")
    if "cuda" in status.index:
        return "The CUDA rows read ``not run'' (" + status.loc["cuda", "reason"] + ")."
    return ""
