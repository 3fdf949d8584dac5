"""One typed, validated configuration per study: a frozen dataclass whose fields are the study's
parameters, checked once against its `Param` declarations.

`StudyConfig` is the shared machinery (the training and longrun studies use it; it imports
nothing but `keybias.studies.params`). A study declares `PARAMETERS` (name -> `Param`) as
before, so `params.load_profile` validates a profile before any notebook runs, and a frozen
dataclass with one field per parameter whose defaults are the smoke profile. A test checks
that the fields and `PARAMETERS` name the same parameters and that the defaults equal
`params/smoke.yaml`.

Building a config checks every value (`Param.check`), so a study function that takes a config
needs no argument checks of its own; an unknown or misspelled key, from a profile or a caller,
is an error naming the nearest valid key.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any, ClassVar

from keybias.studies.params import Param, ParameterError


def unknown_key_error(where: str, key: str, allowed) -> ParameterError:
    """A ParameterError for an unknown `key` that names the nearest allowed key, if one is close."""
    allowed = sorted(allowed)
    near = difflib.get_close_matches(key, allowed, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return ParameterError(f"{where}: unknown parameter {key!r}{hint} (allowed: {allowed})")


@dataclasses.dataclass(frozen=True)
class StudyConfig:
    """Base of the per-study configs: validation in `__post_init__`, `from_mapping` for profiles.

    List parameters are stored as tuples (the config is frozen and hashable-by-value)."""

    PARAMETERS: ClassVar[dict[str, Param]] = {}
    STUDY: ClassVar[str] = "study"

    def __post_init__(self) -> None:
        names = {f.name for f in dataclasses.fields(self)}
        if names != set(self.PARAMETERS):
            raise TypeError(f"{type(self).__name__}: fields {sorted(names ^ set(self.PARAMETERS))} are not "
                            "both fields and PARAMETERS")
        for name, spec in self.PARAMETERS.items():
            value = getattr(self, name)
            if spec.many and isinstance(value, tuple):
                value = list(value)
            checked = spec.check(f"{self.STUDY}.{name}", value)
            object.__setattr__(self, name, tuple(checked) if spec.many else checked)
        self.check()

    def check(self) -> None:
        """Cross-parameter checks of a study (override); raise ParameterError naming the parameters."""

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str | None = None):
        """A config from a mapping (a profile section, a notebook's parameters): unknown keys are an
        error naming the nearest valid key; missing keys take the smoke-profile defaults."""
        where = where or cls.STUDY
        names = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in names:
                raise unknown_key_error(where, key, names)
        return cls(**dict(values))

    def replace(self, **changes):
        """A copy with `changes` (validated like a new config; misspelled keys name the nearest)."""
        names = [f.name for f in dataclasses.fields(self)]
        for key in changes:
            if key not in names:
                raise unknown_key_error(self.STUDY, key, names)
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """The parameters as plain values (lists for list parameters), e.g. for macros or a profile."""
        return {name: list(v) if isinstance(v, tuple) else v for name, v in dataclasses.asdict(self).items()}
