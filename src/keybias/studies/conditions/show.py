"""The conditions study's table and figure, in the words of the paper."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pandas as pd

from keybias.core.recorder import format_number
from keybias.studies import style
from keybias.studies.conditions.cases import CASE_BY_KEY, NOT_REDUNDANT, REDUNDANT

# what each measured quantity is, in the table's words
QUANTITY_WORDS = {"output": "output", "gradient": "gradient", "adam_step": "Adam step", "fold": "folded output"}


def case_label(condition: str, variant: str) -> str:
    """The reader's name of a case (a KeyError for a case that `cases.CASES` does not hold)."""
    return CASE_BY_KEY[(condition, variant)].label

def table_latex(summary_frame: pd.DataFrame) -> str:
    """The paper's table of conditions: one row per case, with its prediction and verdict."""
    lines = [r"\begin{tabular}{lllll}", r"\toprule",
             r"case & measured & worst effect & bound & verdict \\", r"\midrule"]
    for r in summary_frame.itertuples():
        effect = "NaN" if not math.isfinite(r.effect) else f"${format_number(r.effect, 2)}$"
        comparison = r"\le" if r.comparison == "<=" else r"\ge"
        lines.append(
            f"{case_label(r.condition, r.variant)} & {QUANTITY_WORDS[r.quantity]} & {effect} & "
            f"${comparison} {format_number(r.bound, 1)}$ & {r.verdict.replace('_', ' ')} \\\\"
        )
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def effect_figure(summary_frame: pd.DataFrame):
    """Worst effect per case on a log axis, coloured by prediction, with each case's bound. The Adam
    rows count learning rates, the others are relative changes, so each unit gets its own panel."""
    # deferred with `style`, which loads matplotlib: measuring and judging need no plotting library
    style.apply()
    frame = summary_frame.reset_index(drop=True)
    is_step = frame["quantity"] == "adam_step"
    panels = [(frame[~is_step], "worst relative change over seeds (output, folded output or gradient)"),
              (frame[is_step], r"worst step on $b_k$ over seeds (learning rates per step)")]
    panels = [(p.reset_index(drop=True), label) for p, label in panels if len(p)]
    fig, axes = plt.subplots(len(panels), 1, squeeze=False,
                             figsize=(style.FULL_WIDTH, 0.16 * len(frame) + 0.75 * len(panels) + 0.5),
                             gridspec_kw={"height_ratios": [len(p) + 1.5 for p, _ in panels]})
    floor = 1e-18  # exact zeros are drawn at the floor, not dropped
    colours = {REDUNDANT: style.OKABE_ITO[0], NOT_REDUNDANT: style.OKABE_ITO[3]}
    markers = {REDUNDANT: "o", NOT_REDUNDANT: "s"}
    for ax, (part, xlabel) in zip(axes[:, 0], panels, strict=True):
        for predicted in (REDUNDANT, NOT_REDUNDANT):
            sel = part[part["predicted"] == predicted]
            ax.scatter(sel["effect"].clip(lower=floor), sel.index, color=colours[predicted],
                       marker=markers[predicted], s=16, label=f"predicted {predicted.replace('_', ' ')}")
        # each case is judged against its own bound, so mark it per row
        ax.scatter(part["bound"], part.index, marker="|", s=60, color=style.OKABE_ITO[7], label="bound of the case")
        ax.set_xscale("log")
        ax.set_yticks(part.index, [case_label(c, v) for c, v in zip(part["condition"], part["variant"], strict=True)])
        ax.set_ylim(len(part) - 0.5, -0.5)
        ax.set_xlabel(xlabel)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.tight_layout()
    style.legend_outside(fig, handles=handles, labels=labels, ncol=3)
    return fig


QUIRK_LABELS = {"plain": "no appended slot", "add_bias_kv": "add_bias_kv=True", "add_zero_attn": "add_zero_attn=True"}


def quirk_figure(quirk: pd.DataFrame):
    """Per option of nn.MultiheadAttention (causal mask): how far need_weights=True moves the output
    from need_weights=False, and how far each call lies from the documented computation. Returns
    (figure, caption); the caption's numbers are the ones drawn."""
    style.apply()
    frame = quirk.reset_index(drop=True)
    floor = 1e-18  # an exact zero is drawn at the floor, not dropped
    series = (("max_abs_diff_need_weights", "True against False", "o", 0),
              ("max_abs_diff_false_vs_reference", "False against the documented result", "s", 3),
              ("max_abs_diff_true_vs_reference", "True against the documented result", "^", 2))
    fig, ax = plt.subplots(figsize=(style.FULL_WIDTH, 0.35 * len(frame) + 1.0))
    for offset, (column, label, marker, colour) in zip((-0.15, 0.0, 0.15), series, strict=True):
        ax.scatter(frame[column].clip(lower=floor), frame.index + offset, marker=marker, s=22,
                   color=style.OKABE_ITO[colour], label=f"need_weights={label}")
    ax.set_xscale("log")
    ax.set_yticks(frame.index, [QUIRK_LABELS.get(o, o) for o in frame["option"]])
    ax.invert_yaxis()
    ax.set_xlabel("largest absolute difference of an output entry (float64, causal mask)")
    style.legend_outside(fig, ncol=2)
    fig.tight_layout()
    by = frame.set_index("option")
    slots = [o for o in by.index if o != "plain"]

    def num(value: float) -> str:
        return f"${format_number(float(value), 2)}$"

    parts = [f"{num(by.loc[o, 'max_abs_diff_need_weights'])} with {QUIRK_LABELS.get(o, o)}" for o in slots]
    worst = by.loc[slots] if slots else by
    false_off = worst["max_abs_diff_false_vs_reference"] > worst["max_abs_diff_true_vs_reference"]
    departs = ("; it is the need_weights=False call that departs from the documented result" if false_off.all()
               else "; it is the need_weights=True call that departs from the documented result"
               if (~false_off).all() else "")
    caption = ("With a causal mask, need_weights=True changes the float64 output by up to " + " and ".join(parts)
               + f"{departs}. Without an appended slot the two calls differ by "
               f"{num(by.loc['plain', 'max_abs_diff_need_weights'])}, float64 rounding."
               if "plain" in by.index and slots else "")
    return fig, caption
