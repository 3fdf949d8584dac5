"""Showing the GPU profile: the table of CPU judges applied to the GPU's data, and its sentence."""

from __future__ import annotations

import math

import pandas as pd

from keybias.core.recorder import Claim, latex_escape

STUDY_OF_PREFIX = {"invariance": "invariance (02)", "precision": "precision (03)", "cost": "cost (06)"}
SIGNS = {"<=": r"\le", ">=": r"\ge", "<": "<", ">": ">", "==": "=", "!=": r"\ne"}


def transfer_table(claims) -> pd.DataFrame:
    """One row per CPU judge applied to the GPU's data: which study, the claim, value, bound, outcome."""
    rows = []
    for given in claims:
        c = Claim.from_any(given)
        study = STUDY_OF_PREFIX.get(c.id.split("-", 1)[0], "other")
        rows.append({"study": study, "claim": c.id, "kind": c.kind, "value": c.value, "comparison": c.comparison,
                     "bound": c.bound, "holds": c.holds})
    return pd.DataFrame(rows, columns=["study", "claim", "kind", "value", "comparison", "bound", "holds"])


def _num(x: float) -> str:
    if not math.isfinite(x):
        return "--"
    return f"{x:.3g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"


def transfer_latex(table: pd.DataFrame) -> str:
    """The transfer table as a booktabs tabular."""
    lines = [r"\begin{tabular}{llrcrl}", r"\toprule", r"study & check & value & & bound & on the GPU \\", r"\midrule"]
    for r in table.itertuples():
        lines.append(f"{r.study} & \\texttt{{{latex_escape(r.claim)}}} & {_num(r.value)} & ${SIGNS[r.comparison]}$ & "
                     f"{_num(r.bound)} & {'holds' if r.holds else 'fails'} \\\\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)


def transfer_sentence(table: pd.DataFrame) -> str:
    """One sentence for the paper: every transferred check holds, or which fail and by how much."""
    failed = table[~table["holds"]]
    if failed.empty:
        return "Every one of these checks holds on the GPU."
    # a claim id is one long word: allow a line break after each of its hyphens
    breakable = "-{}" + "\\allowbreak{}"
    parts = [rf"\texttt{{{latex_escape(r.claim).replace('-', breakable)}}} "
             rf"(value {_num(r.value)} against the bound {_num(r.bound)})" for r in failed.itertuples()]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    verb = "fails" if len(parts) == 1 else "fail"
    return f"On the GPU, {listed} {verb}; every other check holds."
