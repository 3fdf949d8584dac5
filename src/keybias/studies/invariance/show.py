"""The invariance map, show layer: the figure and the LaTeX tables of notebook 02."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from keybias.core.recorder import latex_escape
from keybias.core.reduce import require_columns
from keybias.studies import style
from keybias.studies.invariance import judge as J
from keybias.studies.params import DTYPES
from keybias.studies.tables import CASE_WORDS, category_label

# the verdict table's joint column, abbreviated as its count headers are so that it fits the page
_VERDICT_ABBREVIATIONS = {"redundant": "red.", "not_redundant": "not red.", "invalid": "inval."}


_LOG_FLOOR = -20.0  # a zero change (0/0 included) sits at the left edge of the axis
_AXIS_LIMIT = 7.8

# The map's rows: the checklist's prediction, and for a predicted break the question of the
# checklist (Section 3) it fails; the cases' assumptions A1 to A4 are questions 1, 2, 2 and 3.
# Forty categories on one axis could not be read at print size; these eight can.
MAP_GROUPS = {
    ("redundant", "mha"): "MHA, redundant", ("redundant", "sizes"): "MHA, redundant",
    ("redundant", "realistic"): "MHA, redundant", ("redundant", "layers"): "Transformer layers",
    ("redundant", "sdpa"): "SDPA and variants", ("redundant", "variants"): "SDPA and variants",
    ("redundant", "hf"): "Hugging Face models",
    ("not_redundant", "A1"): "appended key or slot (Q1)", ("not_redundant", "A2"): "normalised keys (Q2)",
    ("not_redundant", "A3"): "rotary embeddings (Q2)", ("not_redundant", "A4"): "sigmoid weights (Q3)",
    ("invalid", ""): "one key: no test",
}


def map_group(expected: str, family: str, assumption: str) -> str:
    """The row of the invariance map a configuration is drawn in (see MAP_GROUPS)."""
    if expected == "redundant":
        return MAP_GROUPS.get((expected, family), "other, redundant")
    if expected == "not_redundant":
        code = assumption[1:3] if assumption.startswith("(A") else ""
        return MAP_GROUPS.get((expected, code), f"breaks {code or 'other'}")
    return MAP_GROUPS[("invalid", "")]


def plot_map(df: pd.DataFrame, mags: pd.DataFrame):
    """The invariance map, one panel per magnitude: for every measured configuration the b_k
    change and the b_q/b_v control divided by the tolerance *of the same magnitude* (log10; the
    verdict's line is 0), one row per prediction group (`map_group`), dtypes side by side within a
    row. Nothing from one magnitude meets another's tolerance."""
    style.apply()
    m = J.measured(df)[["config_id", "expected", "family", "assumption", "dtype"]]
    m = m.assign(group=[map_group(str(e), str(f), str(a)) for e, f, a in
                        zip(m["expected"], m["family"], m["assumption"].fillna(""), strict=True)])
    j = mags.merge(m[["config_id", "group", "dtype"]], on="config_id")
    order = list(dict.fromkeys(MAP_GROUPS.values()))
    groups = sorted(j["group"].unique(), key=lambda g: (order.index(g) if g in order else len(order), g))
    levels = sorted(j.magnitude.unique())
    dts = [d for d in DTYPES if d in set(j.dtype)]
    # colour and shape both tell the dtypes apart, so that orange and vermillion never have to
    colour = dict(zip(DTYPES, (style.OKABE_ITO[0], style.OKABE_ITO[1], style.OKABE_ITO[2], style.OKABE_ITO[4]),
                      strict=True))
    shape = dict(zip(DTYPES, ("o", "s", "D", "v"), strict=True))
    offset = {dt: (i - (len(dts) - 1) / 2) * 0.8 / max(len(dts), 1) for i, dt in enumerate(dts)}
    height = max(2.4, 0.32 * len(groups) + 1.3)
    fig, axes = plt.subplots(1, len(levels), figsize=(style.FULL_WIDTH, height), sharey=True, squeeze=False)

    def lg(num, den):
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.log10(num.astype(float).to_numpy() / den.astype(float).to_numpy())
        return np.clip(np.where(np.isnan(r), _LOG_FLOOR, r), -_AXIS_LIMIT, _AXIS_LIMIT)

    rng = np.random.default_rng(0)
    for ax, mag in zip(axes[0], levels, strict=True):
        sub = j[j.magnitude == mag]
        y = sub["group"].map({g: i for i, g in enumerate(groups)}).to_numpy().astype(float)
        y = y + sub["dtype"].map(offset).to_numpy() + (rng.random(len(sub)) - 0.5) * 0.12
        for dt in dts:
            sel = (sub.dtype == dt).to_numpy()
            ax.scatter(lg(sub.bk_abs, sub.tolerance_abs)[sel], y[sel], s=10, marker=shape[dt],
                       color=colour[dt], alpha=0.7, lw=0, label=f"$b_k$, {dt}")
            # controls in grey, whatever the dtype: right of the threshold they show power, not a break
            ax.scatter(lg(sub.control_abs, sub.tolerance_abs)[sel], y[sel], s=8, marker="^",
                       facecolors="none", edgecolors="0.55", lw=0.5, alpha=0.6,
                       label="$b_q$, $b_v$ control")
        ax.axvline(0.0, color="black", lw=0.8)
        for i in range(1, len(groups)):
            ax.axhline(i - 0.5, color="0.85", lw=0.5)
        ax.set_title(rf"$\|b_k\| = {mag:g}\,\|k\|_{{\mathrm{{typ}}}}$")
        ax.set_xlim(-8, 8)  # zero or unbounded ratios are drawn at the edges
        ax.grid(axis="x", alpha=0.3)
    axes[0][len(levels) // 2].set_xlabel(r"log$_{10}$(change / tolerance); left of the line: no change")
    axes[0][0].set_yticks(range(len(groups)), groups)
    axes[0][0].set_ylim(len(groups) - 0.5, -0.5)
    handles, labels = axes[0][0].get_legend_handles_labels()
    uniq = dict(zip(labels, handles, strict=True))
    uniq = {k: uniq[k] for k in sorted(uniq, key=lambda k: "control" in k)}  # dtypes first, the control last
    fig.legend(uniq.values(), uniq.keys(), loc="upper center", ncol=len(uniq), frameon=False,
               bbox_to_anchor=(0.5, 0.0), markerscale=2.0, columnspacing=1.0, handletextpad=0.3)
    fig.tight_layout()
    return fig


def _tabular(table: pd.DataFrame, head: dict, align: str) -> str:
    cols = list(table.columns)
    lines = [r"\begin{tabular}{" + align + "}", r"\toprule",
             " & ".join(latex_escape(head.get(c, c)) for c in cols) + r" \\", r"\midrule"]
    for _, r in table.iterrows():
        lines.append(" & ".join(latex_escape(r[c]) for c in cols) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def verdict_latex(table: pd.DataFrame) -> str:
    """booktabs tabular of `judge.verdict_table`, categories and joint verdicts in words."""
    require_columns(table, ["category", "joint"], "verdict table")
    # the device rows hold no CPU verdict; the caption says once where the GPU's verdicts are
    table = table[~table["category"].astype(str).str.startswith("device ")].copy()
    # the figure's order: MHA, layers, SDPA, variants, Hugging Face models
    order = list(CASE_WORDS)
    rank = table["category"].map(lambda c: order.index(c) if c in order else len(order))
    table = table.assign(_rank=rank).sort_values(["_rank", "category"], kind="stable").drop(columns="_rank")
    table["category"] = table["category"].map(category_label)
    table["joint"] = table["joint"].map(
        lambda v: ", ".join(_VERDICT_ABBREVIATIONS.get(w, w) for w in str(v).split(",")) if isinstance(v, str) else v)
    head = {"category": "configuration", "redundant": "red.", "not_redundant": "not red.",
            "invalid": "inval.", "skipped": "skip.", "matches_theory": "as predicted", "joint": "with slot"}
    return _tabular(table, head, "l" + "r" * (len(table.columns) - 1))


def _eps(x) -> str:
    """A power of ten as a person writes it: 1 and 10 plainly, others as $10^{k}$."""
    if not (isinstance(x, float | int) and math.isfinite(x)):
        return "none"
    k = round(math.log10(x))
    return {0: "1", 1: "10", 2: "100"}.get(k, f"$10^{{{k}}}$")


def power_latex(power: pd.DataFrame) -> str:
    """booktabs tabular of `judge.power_table`: the smallest per-key break detected."""
    t = power.assign(min_detectable_eps=power.min_detectable_eps.map(_eps))
    head = {"embed_dim": "$E$", "num_heads": "heads", "tgt_len": "queries", "src_len": "keys",
            "batch": "batch", "rows": "rows", "min_detectable_eps": r"smallest $\delta$ seen",
            "undetected": "no break seen", "blind_states": "perturbed states blind"}
    cols = list(t.columns)
    lines = [r"\begin{tabular}{l" + "r" * (len(cols) - 1) + "}", r"\toprule",
             " & ".join(head.get(c, latex_escape(c)) for c in cols) + r" \\", r"\midrule"]
    for _, r in t.iterrows():
        lines.append(" & ".join(str(r[c]) if c == "min_detectable_eps" else latex_escape(r[c]) for c in cols) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def power_by_dtype(power: pd.DataFrame) -> pd.DataFrame:
    """`judge.power_table` summarised per dtype for a page: how many sizes and configurations,
    the worst smallest detected break over the sizes (NaN where some size detected none), and the
    totals of configurations and perturbed states in which no break was seen."""
    cols = ["dtype", "sizes", "rows", "min_detectable_eps", "undetected", "blind_states"]
    if not len(power):
        return pd.DataFrame(columns=cols)
    worst = J.min_detectable_by_dtype(power)
    out = [{"dtype": dt, "sizes": len(g), "rows": int(g["rows"].sum()), "min_detectable_eps": worst[dt],
            "undetected": int(g["undetected"].sum()), "blind_states": int(g["blind_states"].sum())}
           for dt, g in power.groupby("dtype", sort=False)]
    return pd.DataFrame(out, columns=cols)


POWER_HEADERS = {"sizes": "sizes", "rows": "configurations", "min_detectable_eps": "smallest \u03b5 seen (worst size)",
                 "undetected": "configurations with no break seen", "blind_states": "perturbed states blind"}


def independent_latex(counts: pd.DataFrame) -> str:
    """booktabs tabular of `judge.independent_counts`."""
    head = {"tests": "valid verdicts", "contradictions": "contradictions",
            "predicted_redundant": "pred. redundant", "predicted_not_redundant": "pred. not red."}
    return _tabular(counts, head, "l" + "r" * (len(counts.columns) - 1))


def _num(x) -> str:
    return f"{x:.3g}" if isinstance(x, float | int) and math.isfinite(x) else "--"


def cells_latex(cells: pd.DataFrame) -> str:
    """booktabs tabular of `judge.magnitude_cells`: misses (per verdict, the ties among them, and per
    distinct module) and separation per dtype and magnitude."""
    t = pd.DataFrame({
        "dtype": cells.dtype, "magnitude": cells.magnitude.map(lambda m: f"{m:g}"),
        "power": cells.powered.map({True: "yes", False: "no"}), "valid": cells.valid,
        "known_breaks": cells.known_breaks, "missed": cells.missed, "ties": cells.tie_misses,
        "known_modules": cells.known_modules, "missed_modules": cells.missed_modules,
        "redundant_over_tol": cells.redundant_over_tol.map(_num), "break_over_tol": cells.break_over_tol.map(_num)})
    head = {"known_breaks": "known breaks", "ties": "of them ties", "known_modules": "modules",
            "missed_modules": "missed", "redundant_over_tol": "max redundant / tol.",
            "break_over_tol": "min break / tol."}
    return _tabular(t, head, "ll" + "r" * (len(t.columns) - 2))
