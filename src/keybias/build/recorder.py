"""Writing results: CSV data, figures, LaTeX tables, macros, equations and claims.

A notebook makes one `Recorder` and hands it everything it wants to keep. The recorder
writes under `output_dir`, which the pipeline points at a private staging folder; the
pipeline moves the files into `results/` only after the whole notebook succeeded, so a
failed run never leaves something that looks finished.

Layout under `output_dir` (the results contract, see README):
    data/<name>.csv  figures/<name>.pdf|png  tables/<name>.tex
    macros/<notebook>.tex  equations/<name>.tex  steps/<notebook>.json (claims)
"""

from __future__ import annotations

import json
import math
import operator
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

_COMPARISONS = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
    "==": operator.eq,
}
CLAIM_KINDS = ("test", "consistency", "implied")
_UMASK = os.umask(0o022)
os.umask(_UMASK)
_MACRO_NAME = re.compile(r"^[A-Za-z]+$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9_\-]+$")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; results are meant to be read by all
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def format_number(value: float, digits: int = 3) -> str:
    """Format a number for LaTeX: plain for moderate values, `a\\times10^{b}` otherwise."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}".replace(",", "{,}")
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    exponent = math.floor(math.log10(abs(value)))
    if -3 <= exponent < 5:
        decimals = max(digits - 1 - exponent, 0)
        return f"{value:.{decimals}f}"
    mantissa = value / 10**exponent
    return f"{mantissa:.{max(digits - 1, 0)}f}\\times10^{{{exponent}}}"


def _check_file_name(name: str) -> str:
    if not _FILE_NAME.match(name):
        raise ValueError(f"output name {name!r} must use letters, digits, '_' and '-' only")
    return name


class Recorder:
    """Collects one notebook's outputs and writes each of them atomically.

    Claims are checked here, not typed in: `claim` receives the measured value, the bound
    and the comparison, and computes `holds` itself.
    """

    def __init__(self, notebook: str, output_dir: str | os.PathLike, *, profile: str, device: str):
        self.notebook = _check_file_name(notebook)
        self.root = Path(output_dir)
        self.profile = profile
        self.device = device
        self.macros: dict[str, str] = {}
        self.machine_macros: dict[str, str] = {}
        self.claims: list[dict[str, Any]] = []
        self.outputs: list[str] = []
        self.figure_alt: dict[str, str] = {}

    def _path(self, sub: str, name: str, suffix: str) -> Path:
        path = self.root / sub / f"{_check_file_name(name)}{suffix}"
        self.outputs.append(f"{sub}/{path.name}")
        return path

    def csv(self, frame: pd.DataFrame, name: str) -> Path:
        path = self._path("data", name, ".csv")
        atomic_write_text(path, frame.to_csv(index=False, float_format="%.9g"))
        return path

    def machine_csv(self, frame: pd.DataFrame, name: str) -> Path:
        """Write machine-specific data (wall times, thread counts) to `machine/<name>.csv`.

        `make verify` never compares these files; data files under `data/` hold no timings.
        """
        path = self._path("machine", name, ".csv")
        atomic_write_text(path, frame.to_csv(index=False, float_format="%.9g"))
        return path

    def figure(self, fig, name: str, alt: str | None = None) -> tuple[Path, Path]:
        """Save a matplotlib figure as PDF (for the paper) and PNG (for reading).

        `alt` says in words what the figure shows; it is kept in the step record
        (`figures_alt`) so the rendered notebook and the index page can use it as alt text.
        """
        if alt is not None:
            self.figure_alt[name] = alt
        paths = []
        for suffix, options in ((".pdf", {"metadata": {"CreationDate": None}}), (".png", {"dpi": 150})):
            path = self._path("figures", name, suffix)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
            os.close(fd)
            try:
                fig.savefig(tmp, bbox_inches="tight", **options)
                os.chmod(tmp, 0o666 & ~_UMASK)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            paths.append(path)
        return tuple(paths)

    def table(self, latex: str | pd.DataFrame, name: str, **to_latex) -> Path:
        """Write a LaTeX table body (a tabular); DataFrames go through `to_latex`."""
        if isinstance(latex, pd.DataFrame):
            latex = latex.to_latex(index=False, escape=True, **to_latex)
        path = self._path("tables", name, ".tex")
        atomic_write_text(path, latex)
        return path

    def equation(self, latex: str, name: str) -> Path:
        path = self._path("equations", name, ".tex")
        atomic_write_text(path, latex.strip() + "\n")
        return path

    def macro(self, name: str, value: Any, digits: int = 3) -> str:
        """Define `\\name` as the formatted value; numbers pass through `format_number`."""
        if not _MACRO_NAME.match(name):
            raise ValueError(f"macro name {name!r} must be letters only (a LaTeX command name)")
        if name in self.macros or name in self.machine_macros:
            raise ValueError(f"macro {name!r} defined twice in {self.notebook}")
        text = value if isinstance(value, str) else format_number(value, digits)
        self.macros[name] = text
        return text

    def machine_macro(self, name: str, value: Any, digits: int = 3) -> str:
        """Define `\\name` in `macros/<notebook>_machine.tex`: a number of this machine (a
        timing, a load), kept apart so the notebook's other macros can be compared."""
        text = self.macro(name, value, digits)
        self.machine_macros[name] = self.macros.pop(name)
        return text

    def claim(
        self,
        claim_id: str,
        statement: str,
        value: float,
        bound: float,
        comparison: str = "<=",
        *,
        kind: str | None = None,
        implied_by: list[str] | str | None = None,
        bound_origin: str | None = None,
        min_detectable: float | None = None,
    ) -> dict[str, Any]:
        """Record a claim: it holds when `value <comparison> bound`.

        `kind` is `test` (plausible data could contradict it), `consistency` (a bookkeeping
        cross-check) or `implied` (follows from the claims named in `implied_by`).
        `bound_origin` says in one phrase where the bound comes from (theory, a held-out
        calibration, the issue), and `min_detectable` is, for a "no effect" claim, the
        smallest effect its positive control shows it would have seen.
        """
        if comparison not in _COMPARISONS:
            raise ValueError(f"comparison {comparison!r} not one of {sorted(_COMPARISONS)}")
        if kind is not None and kind not in CLAIM_KINDS:
            raise ValueError(f"claim {claim_id!r}: kind {kind!r} not one of {CLAIM_KINDS}")
        if kind == "implied" and not implied_by:
            raise ValueError(f"claim {claim_id!r} is 'implied' but names no claim in implied_by")
        if any(c["id"] == claim_id for c in self.claims):
            raise ValueError(f"claim {claim_id!r} recorded twice")
        value = float(value)
        bound = float(bound)
        holds = bool(_COMPARISONS[comparison](value, bound)) and math.isfinite(value)
        record = {
            "id": claim_id,
            "statement": statement,
            "value": value,
            "bound": bound,
            "comparison": comparison,
            "holds": holds,
            "notebook": self.notebook,
            "device": self.device,
            "profile": self.profile,
            "kind": kind,
        }
        if implied_by:
            record["implied_by"] = [implied_by] if isinstance(implied_by, str) else list(implied_by)
        if bound_origin is not None:
            record["bound_origin"] = bound_origin
        if min_detectable is not None:
            record["min_detectable"] = float(min_detectable)
        self.claims.append(record)
        return record

    def claims_from(self, claims) -> list[dict[str, Any]]:
        """Record claims given as tuples (positional arguments of `claim`) or dicts (keywords)."""
        return [self.claim(**c) if isinstance(c, dict) else self.claim(*c) for c in claims]

    def finish(self) -> dict[str, Any]:
        """Write the macros file and the step record (claims and output list)."""
        lines = [f"% generated by notebooks/{self.notebook}.ipynb, profile {self.profile}"]
        lines += [f"\\newcommand{{\\{k}}}{{{v}}}" for k, v in sorted(self.macros.items())]
        if self.machine_macros:
            name = f"{self.notebook}_machine"
            machine = [f"% generated by notebooks/{self.notebook}.ipynb, profile {self.profile}: this machine's numbers"]
            machine += [f"\\newcommand{{\\{k}}}{{{v}}}" for k, v in sorted(self.machine_macros.items())]
            atomic_write_text(self._path("macros", name, ".tex"), "\n".join(machine) + "\n")
            lines.append(f"\\input{{../results/macros/{name}.tex}}")
        macro_path = self._path("macros", self.notebook, ".tex")
        atomic_write_text(macro_path, "\n".join(lines) + "\n")
        step = {
            "notebook": self.notebook,
            "profile": self.profile,
            "device": self.device,
            "claims": self.claims,
            "figures_alt": dict(sorted(self.figure_alt.items())),
            "outputs": sorted(set(self.outputs)),
        }
        atomic_write_text(
            self.root / "steps" / f"{self.notebook}.json", json.dumps(step, indent=2) + "\n"
        )
        return step
