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
from collections.abc import Iterable
from dataclasses import dataclass, field
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
# test: plausible data could contradict it; proof: an exact identity (SymPy, or float64 on the
# project's own code), a proof check rather than an empirical test; control: a positive control,
# which shows the power of the test it protects; consistency: a bookkeeping cross-check;
# implied: follows from the claims it names.
CLAIM_KINDS = ("test", "proof", "control", "consistency", "implied")
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
    """Format a number for LaTeX as a person writes it: `digits` significant figures without
    trailing zeros (0.01, not 0.0100), plain for moderate values, `a\\times10^{b}` otherwise, and
    `10^{b}` where the mantissa is 1."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}".replace(",", "{,}")
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    exponent = math.floor(math.log10(abs(value)))
    if -3 <= exponent < 5:
        decimals = max(digits - 1 - exponent, 0)
        return _without_trailing_zeros(f"{value:.{decimals}f}")
    mantissa = f"{value / 10**exponent:.{max(digits - 1, 0)}f}"
    if abs(float(mantissa)) >= 10:  # 9.996 rounds up to 10.0: one more power of ten
        exponent += 1
        mantissa = f"{value / 10**exponent:.{max(digits - 1, 0)}f}"
    mantissa = _without_trailing_zeros(mantissa)
    if mantissa in ("1", "-1"):
        return f"{mantissa[:-1]}10^{{{exponent}}}"
    return f"{mantissa}\\times10^{{{exponent}}}"


def _without_trailing_zeros(text: str) -> str:
    return text.rstrip("0").rstrip(".") if "." in text else text


def _check_file_name(name: str) -> str:
    if not _FILE_NAME.match(name):
        raise ValueError(f"output name {name!r} must use letters, digits, '_' and '-' only")
    return name


@dataclass(frozen=True)
class Claim:
    """One claim as a judge states it; `holds` is computed from value, comparison and bound.

    `kind` is one of `CLAIM_KINDS`. A `control` names in `protects` the test claims whose power
    it shows. `bound_origin` says in one phrase where the bound comes from
    (theory, a held-out calibration, the issue). `implied_by` names the claims an `implied` claim
    follows from; `identity` names the identity a `proof` claim checks; `min_detectable` is, for a
    "no effect" claim, the smallest effect its positive control shows it would have seen;
    `exclusions` lists the data a reduction left out, each with its reason
    (`keybias.core.reduce.Exclusion`, written as text).
    """

    id: str
    statement: str
    value: float
    bound: float
    comparison: str = "<="
    kind: str | None = None
    bound_origin: str | None = None
    implied_by: tuple[str, ...] = ()
    protects: tuple[str, ...] = ()
    min_detectable: float | None = None
    identity: str | None = None
    exclusions: tuple[str, ...] = field(default=())

    def __post_init__(self):
        if self.comparison not in _COMPARISONS:
            raise ValueError(f"claim {self.id!r}: comparison {self.comparison!r} not one of {sorted(_COMPARISONS)}")
        if self.kind is not None and self.kind not in CLAIM_KINDS:
            raise ValueError(f"claim {self.id!r}: kind {self.kind!r} not one of {CLAIM_KINDS}")
        implied = (self.implied_by,) if isinstance(self.implied_by, str) else tuple(self.implied_by or ())
        object.__setattr__(self, "implied_by", implied)
        protects = (self.protects,) if isinstance(self.protects, str) else tuple(self.protects or ())
        object.__setattr__(self, "protects", protects)
        object.__setattr__(self, "exclusions", tuple(str(e) for e in self.exclusions or ()))
        object.__setattr__(self, "value", float(self.value))
        object.__setattr__(self, "bound", float(self.bound))
        if self.min_detectable is not None:
            object.__setattr__(self, "min_detectable", float(self.min_detectable))
        if self.kind == "implied" and not self.implied_by:
            raise ValueError(f"claim {self.id!r} is 'implied' but names no claim in implied_by")
        if self.kind == "control" and not self.protects:
            raise ValueError(f"claim {self.id!r} is a 'control' but names no test claim in protects")
        if self.kind == "proof" and not str(self.identity or "").strip():
            raise ValueError(f"claim {self.id!r} is a 'proof' but names no identity")

    @property
    def holds(self) -> bool:
        """`value <comparison> bound`, and never for a NaN or infinite value."""
        return bool(_COMPARISONS[self.comparison](self.value, self.bound)) and math.isfinite(self.value)

    @property
    def margin(self) -> float:
        """How far the value sits inside its bound, as a ratio (> 1 inside, < 1 outside, NaN if
        undefined): bound/value for an upper bound, value/bound for a lower one."""
        return margin_ratio(self.value, self.bound, self.comparison)

    @classmethod
    def from_any(cls, claim: Claim | dict | tuple | list) -> Claim:
        """A Claim from a Claim, a dict (keywords; `claim_id` is accepted for `id`) or a tuple
        (the positional arguments of `Recorder.claim`)."""
        if isinstance(claim, cls):
            return claim
        if isinstance(claim, dict):
            data = dict(claim)
            if "claim_id" in data:
                if "id" in data:
                    raise ValueError(f"claim {data['id']!r} gives both id and claim_id")
                data["id"] = data.pop("claim_id")
            for computed in ("holds", "notebook", "device", "profile"):
                data.pop(computed, None)  # a record read back: these are recomputed or re-stamped
            return cls(**data)
        return cls(*claim)

    def record(self, notebook: str, device: str, profile: str) -> dict[str, Any]:
        """The JSON record of the claim in a step file (`steps/<notebook>.json`)."""
        out: dict[str, Any] = {
            "id": self.id, "statement": self.statement, "value": self.value, "bound": self.bound,
            "comparison": self.comparison, "holds": self.holds, "notebook": notebook,
            "device": device, "profile": profile, "kind": self.kind,
        }
        if self.implied_by:
            out["implied_by"] = list(self.implied_by)
        if self.protects:
            out["protects"] = list(self.protects)
        if self.bound_origin is not None:
            out["bound_origin"] = self.bound_origin
        if self.min_detectable is not None:
            out["min_detectable"] = self.min_detectable
        if self.identity is not None:
            out["identity"] = self.identity
        if self.exclusions:
            out["exclusions"] = list(self.exclusions)
        return out


def margin_ratio(value: float, bound: float, comparison: str) -> float:
    """Distance of `value` from `bound` as a ratio, > 1 on the side the comparison asks for:
    bound/value for `<=`/`<`, value/bound for `>=`/`>`; for `==`, 1 when equal and 0 otherwise.
    NaN when the ratio is undefined (a NaN value, or a zero that a ratio cannot place)."""
    value, bound = float(value), float(bound)
    if not (math.isfinite(value) and math.isfinite(bound)):
        return math.nan
    if comparison == "==":
        return 1.0 if value == bound else 0.0
    upper = comparison in ("<=", "<")
    num, den = (bound, value) if upper else (value, bound)
    if den == 0:
        return math.inf if num > 0 else math.nan
    return num / den


def latex_escape(text: str) -> str:
    """`text` with LaTeX's special characters escaped, for plain prose in a table cell or macro.

    The one escaper of the project: build code and studies import it from here."""
    text = str(text).replace("\\", "\x00")
    for char, repl in (("&", r"\&"), ("%", r"\%"), ("$", r"\$"), ("#", r"\#"), ("_", r"\_"),
                       ("{", r"\{"), ("}", r"\}"), ("~", r"\~{}"), ("^", r"\^{}")):
        text = text.replace(char, repl)
    return text.replace("\x00", r"\textbackslash{}")


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
        for suffix, options in ((".pdf", {"metadata": {"CreationDate": None}}), (".png", {"dpi": 200})):
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
        claim_id: str | Claim,
        statement: str | None = None,
        value: float | None = None,
        bound: float | None = None,
        comparison: str = "<=",
        *,
        kind: str | None = None,
        implied_by: list[str] | str | None = None,
        bound_origin: str | None = None,
        min_detectable: float | None = None,
        identity: str | None = None,
        exclusions: Iterable[Any] = (),
    ) -> dict[str, Any]:
        """Record a claim, given as a `Claim` or as its fields: it holds when
        `value <comparison> bound` (see `Claim` for the fields). Returns the written record."""
        if isinstance(claim_id, Claim):
            claim = claim_id
        else:
            claim = Claim(claim_id, statement, value, bound, comparison, kind=kind,
                          bound_origin=bound_origin, implied_by=implied_by or (),
                          min_detectable=min_detectable, identity=identity, exclusions=exclusions)
        if any(c["id"] == claim.id for c in self.claims):
            raise ValueError(f"claim {claim.id!r} recorded twice")
        record = claim.record(self.notebook, self.device, self.profile)
        self.claims.append(record)
        return record

    def claims_from(self, claims) -> list[dict[str, Any]]:
        """Record claims given as `Claim`s, dicts (keywords; `claim_id` or `id`) or tuples
        (positional arguments of `claim`)."""
        return [self.claim(Claim.from_any(c)) for c in claims]

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
