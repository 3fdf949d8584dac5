"""Profiles and their validation.

A profile (`params/<name>.yaml`) has one section per notebook. Each notebook's allowed
parameters are declared in the `PARAMETERS` dict of the module it uses (see
`NOTEBOOK_SPECS`). papermill only warns about unknown parameters and guesses types, so
every value is checked here, before any notebook runs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from keybias.core.provenance import devices_present  # noqa: F401  (re-exported: measures use it)

DTYPES = ("float64", "float32", "bfloat16", "float16")
# The one dtype -> macro-word map: LaTeX macro names are letters only, so `\IndepTestsFloatThirtyTwo`
# and every per-dtype macro of the studies spell the dtype with these words.
DTYPE_MACRO = {
    "float64": "FloatSixtyFour",
    "float32": "FloatThirtyTwo",
    "float16": "FloatSixteen",
    "bfloat16": "BfloatSixteen",
}
DEVICES = ("cpu", "cuda", "mps", "auto")
# Parameters that the pipeline sets itself; a profile may not set them.
INJECTED = ("profile", "device", "output_dir", "results_dir")

# notebook name -> module whose PARAMETERS dict declares the notebook's parameters
NOTEBOOK_SPECS = {
    "01_symbolic": "keybias.studies.symbolic.derive",
    "02_invariance": "keybias.studies.invariance.measure",
    "03_precision": "keybias.studies.precision.measure",
    "04_training": "keybias.studies.training.measure",
    "05_pretrained": "keybias.studies.pretrained.measure",
    "06_cost": "keybias.studies.cost.config",
    "07_conditions": "keybias.studies.conditions.measure",
    "08_longrun": "keybias.studies.longrun.measure",
    "09_gpu": "keybias.studies.gpu.measure",
    "10_checkpoints": "keybias.studies.checkpoints.config",
}


class ParameterError(ValueError):
    """A profile or command-line value that the pipeline refuses, with the reason."""


@dataclass(frozen=True)
class Param:
    """One parameter: its type, whether it is a list, and the values it may take."""

    type: type
    many: bool = False
    choices: tuple | None = None
    positive: bool = False
    minimum: float | None = None
    maximum: float | None = None
    help: str = ""

    def describe(self) -> str:
        kind = self.type.__name__
        text = f"list of {kind}" if self.many else kind
        if self.choices:
            text += f" from {list(self.choices)}"
        if self.positive:
            text += " > 0"
        if self.minimum is not None:
            text += f" >= {self.minimum}"
        if self.maximum is not None:
            text += f" <= {self.maximum}"
        return text

    def check(self, where: str, value: Any) -> Any:
        if self.many:
            if not isinstance(value, list) or not value:
                raise ParameterError(f"{where} must be a non-empty {self.describe()}, got {value!r}")
            return [self._check_one(f"{where}[{i}]", v) for i, v in enumerate(value)]
        return self._check_one(where, value)

    def _check_one(self, where: str, value: Any) -> Any:
        expected = self.type
        ok = isinstance(value, expected) and not (expected is not bool and isinstance(value, bool))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise ParameterError(
                f"{where} must be {self.describe()}, got {type(value).__name__} {value!r}"
            )
        if self.choices is not None and value not in self.choices:
            raise ParameterError(f"{where} = {value!r} is not allowed; allowed: {list(self.choices)}")
        if self.positive and value <= 0:
            raise ParameterError(f"{where} = {value!r} must be positive ({self.describe()})")
        if self.minimum is not None and value < self.minimum:
            raise ParameterError(f"{where} = {value!r} must be >= {self.minimum}")
        if self.maximum is not None and value > self.maximum:
            raise ParameterError(f"{where} = {value!r} must be <= {self.maximum}")
        return value


def check_choice(name: str, value, allowed) -> None:
    """Raise a ValueError naming `name` and the allowed values unless `value` is one of them."""
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; allowed: {list(allowed)}")


def check_positive_int(name: str, value) -> None:
    """Raise a ValueError naming `name` unless `value` is an int (not a bool) above zero."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def spec_for(notebook: str) -> dict[str, Param]:
    if notebook not in NOTEBOOK_SPECS:
        raise ParameterError(
            f"notebook {notebook!r} has no parameter spec; known: {sorted(NOTEBOOK_SPECS)}"
        )
    module = importlib.import_module(NOTEBOOK_SPECS[notebook])
    return module.PARAMETERS


def profile_path(profile: str, params_dir: Path) -> Path:
    path = Path(params_dir) / f"{profile}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in Path(params_dir).glob("*.yaml"))
        raise ParameterError(f"PROFILE={profile!r} is unknown; allowed: {known}")
    return path


def load_profile(profile: str, params_dir: Path, notebooks: list[str]) -> dict[str, dict[str, Any]]:
    """Read and validate a profile; return checked parameters per notebook."""
    path = profile_path(profile, params_dir)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ParameterError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ParameterError(f"{path}: must map notebook names to parameter sections")
    unknown = sorted(set(raw) - set(NOTEBOOK_SPECS))
    if unknown:
        raise ParameterError(
            f"{path}: unknown notebook section(s) {unknown}; allowed: {sorted(NOTEBOOK_SPECS)}"
        )
    checked: dict[str, dict[str, Any]] = {}
    for notebook in notebooks:
        section = raw.get(notebook)
        if not isinstance(section, dict):
            raise ParameterError(f"{path}: missing section '{notebook}:'")
        spec = spec_for(notebook)
        for name in section:
            if name in INJECTED:
                raise ParameterError(
                    f"{path}: {notebook}.{name} is set by the pipeline (PROFILE/DEVICE), not by a profile"
                )
            if name not in spec:
                raise ParameterError(
                    f"{path}: unknown parameter {notebook}.{name}; allowed: {sorted(spec)}"
                )
        missing = sorted(set(spec) - set(section))
        if missing:
            raise ParameterError(f"{path}: {notebook} lacks parameter(s) {missing}")
        checked[notebook] = {
            name: spec[name].check(f"{notebook}.{name}", section[name]) for name in sorted(spec)
        }
    return checked


def resolve_device(device: str) -> str:
    """Map DEVICE to a present device; an absent one is an error, not a silent fallback."""
    if device not in DEVICES:
        raise ParameterError(f"DEVICE={device!r} is unknown; allowed: {list(DEVICES)}")
    present = devices_present()
    if device == "auto":
        return next(d for d in ("cuda", "mps", "cpu") if present[d])
    if not present[device]:
        raise ParameterError(
            f"DEVICE={device!r} is not present on this machine (present: "
            f"{[d for d, ok in present.items() if ok]}); use DEVICE=cpu or DEVICE=auto"
        )
    return device
