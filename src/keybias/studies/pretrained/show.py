"""Notebook 05, show layer: the figure and the LaTeX tables (no measuring, no judging)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from keybias.core.recorder import latex_escape
from keybias.studies import style


def bias_norms_figure(norms: pd.DataFrame):
    """Norms of b_q, b_k, b_v by layer (log scale), at half the paper's width."""
    style.apply()
    fig, ax = plt.subplots(figsize=(style.HALF_WIDTH, 2.3))
    for (col, label), colour, marker in zip(
            (("bq_norm", "$b_q$"), ("bk_norm", "$b_k$"), ("bv_norm", "$b_v$")),
            style.OKABE_ITO, ("o", "s", "^"), strict=False):
        ax.plot(norms["layer"], norms[col], marker=marker, color=colour, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("Euclidean norm")
    style.legend_outside(ax)
    return fig


def bias_norms_latex(norms: pd.DataFrame) -> str:
    """The per-layer bias table for the paper (a tabular body)."""
    table = norms.rename(columns={
        "bq_norm": r"$\|b_q\|$", "bk_norm": r"$\|b_k\|$", "bv_norm": r"$\|b_v\|$",
        "wk_fro_over_sqrt_din": r"$\|W_k\|_F/\sqrt{d}$", "key_norm_median": "$m_k$",
        "bk_over_key_norm": r"$\|b_k\|/m_k$"})
    return table.to_latex(index=False, escape=False, float_format="%.3g")


def parameters_saved_latex(savings: pd.DataFrame) -> str:
    shown = savings[["model", "layers", "hidden_size", "total_parameters", "key_bias_parameters",
                     "value_bias_parameters", "fraction_key_bias"]].copy()
    shown["fraction_key_bias"] = 100 * shown["fraction_key_bias"]
    return shown.rename(columns={
        "hidden_size": "hidden", "total_parameters": "parameters", "key_bias_parameters": "$b_k$ removed",
        "value_bias_parameters": "$b_v$ folded", "fraction_key_bias": r"$b_k$ share (\%)",
    }).to_latex(index=False, escape=False, float_format="%.4f")


def changes_table(changes: pd.DataFrame) -> pd.DataFrame:
    """The embedding-change table as shown in the paper (1 - min cosine instead of min cosine)."""
    shown = changes[["dtype", "variant", "max_abs_diff", "min_cosine", "over_noise_floor", "tolerance",
                     "tolerance_kind", "verdict"]].copy()
    shown["min_cosine"] = 1 - shown["min_cosine"]
    return shown.rename(columns={"max_abs_diff": "max abs diff", "min_cosine": "1 - min cosine",
                                 "over_noise_floor": "/ noise floor", "tolerance_kind": "tolerance from"})


# families named by a constructor option, in words (the option's own name is code, not a name)
FAMILY_WORDS = {
    "BERT relative_key": "BERT, relative key positions",
    "BERT relative_key_query": "BERT, relative key-and-query positions",
    "LLaMA attention_bias": "LLaMA with projection biases",
    "MHA add_zero_attn": "MHA with an appended zero slot",
    "DeBERTa-v2": "DeBERTa-v2, relative positions",
}


def family_table_latex(table: pd.DataFrame) -> str:
    # the fold decision is the count of folded entries (zero where refused): one column fewer keeps
    # the table readable at print size without scaling it down
    shown = table[["family", "strip", "key_bias_removed", "value_bias_folded", "certified_max_ratio",
                   "whole_change", "forced_change", "bound"]].copy()
    shown["family"] = shown["family"].map(lambda f: FAMILY_WORDS.get(f, f)).str.replace("_", " ", regex=False)
    shown = shown.rename(columns={"strip": "decision", "key_bias_removed": "$b_k$ removed", "value_bias_folded": "$b_v$ folded",
                                  "certified_max_ratio": "certified/tol.", "whole_change": "change",
                                  "forced_change": "by hand", "bound": "bound"})
    return shown.to_latex(index=False, escape=False, float_format="%.2g", na_rep="--")


def short_reason(status: str, reason: str) -> str:
    """A few words for the appendix table, from the tool's (or the builder's) full reason."""
    text = reason.lower()
    if status == "could not build":
        for key, short in (("needs timm", "needs timm"), ("parameters (cap", "over the parameter cap"),
                           ("validationerror", "config rejects tiny sizes"),
                           ("no inputs built", "no generic inputs")):
            if key in text:
                return short
        return "tiny instance fails to build or run"
    if "unknown attention class" in text:
        return "attention class not recognised"
    for key, short in (("rotary", "RoPE rotates the key after $b_k$"),
                       ("disentangled", "disentangled position term uses $b_k$"),
                       ("exercised nothing", "probe inconclusive ($b_q$ control silent)"),
                       ("not called", "module not called on the inputs"),
                       ("acts on the key", "key transformed before the scores")):
        if key in text:
            return short
    return reason[:60]


def model_name(model_class: str) -> str:
    """A model type as readers know it: its class without the suffix (GPTNeoXModel -> GPTNeoX)."""
    name = model_class[:-len("Model")] if model_class.endswith("Model") and model_class != "Model" else model_class
    return latex_escape(name)


def architectures_latex(table: pd.DataFrame) -> str:
    """The appendix table: one line per class, and for refused and not-certified architectures
    one line per reason with the model types (a tabular body)."""
    lines = [r"\begin{tabular}{llrp{0.55\linewidth}}", r"\toprule",
             r"class & reason & count & model types \\", r"\midrule"]
    order = ("removed exactly", "no key bias", "refused", "not certified", "could not build")
    for status in order:
        rows = table[table["status"] == status]
        if rows.empty:
            continue
        groups = rows.groupby(rows.apply(lambda r: short_reason(r.status, r.reason), axis=1))
        listed = status in ("refused", "not certified")
        if status in ("refused", "not certified", "could not build"):
            parts = sorted(groups, key=lambda g: (-len(g[1]), g[0]))
            for i, (why, part) in enumerate(parts):
                # two model types can share one class (mlcd and mlcd_vision_model): name it once, with its count
                counts = part["model_class"].value_counts(sort=False)
                names = ", ".join(model_name(c) + (f" ({n} types)" if n > 1 else "")
                                  for c, n in counts.items()) if listed else ""
                head = "" if i else f"{status}, {len(rows)}" if len(parts) > 1 else status
                names = rf"{{\footnotesize {names}}}" if names else ""
                lines.append(rf"{head} & {why} & {len(part)} & {names} \\")
        else:
            lines.append(rf"{status} & & {len(rows)} & \\")
    lines += [r"\midrule", rf"total & & {len(table)} & \\", r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"
