"""The verify class of every results macro: declared by name, looked up exactly.

Each study declares the macros it writes in its `schema.py`: `MACRO_FILE` (the results file,
`macros/NN_<study>.tex`), `MACROS` (name template -> class: `exact`, `machine` or a key of
`keybias.pipeline.output_classes.TOLERANCES`) and, optionally, `MACRO_AXES` (its own axes) and
`CONDITIONAL_MACROS` (template -> (class, why the committed results may lack it)). A template
names each axis once in braces, `PrecSlope{dtype}`; `expand` writes out every value of it. The
macros the pipeline writes itself (`macros/claims.tex`) are declared here.

`macro_class(rel, name)` looks a name up in the expanded declarations: an undeclared name raises
`UndeclaredMacro`, naming it and where to declare it; a name two templates produce fails when the
declarations load. Nothing here matches a macro name against a pattern.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from functools import cache

from keybias.studies import SCHEMA_STUDIES
from keybias.studies.columns import cols
from keybias.studies.params import DTYPE_MACRO

# Axes every study may use, their values declared once (the dtype words of the macros).
AXES: dict[str, tuple[str, ...]] = {
    "dtype": tuple(DTYPE_MACRO.values()),
    "dtype_wide": (DTYPE_MACRO["float64"], DTYPE_MACRO["float32"]),
    "dtype_rounded": (DTYPE_MACRO["float32"], DTYPE_MACRO["float16"], DTYPE_MACRO["bfloat16"]),
    "dtype_half": (DTYPE_MACRO["float16"], DTYPE_MACRO["bfloat16"]),
    "dtype_trained": (DTYPE_MACRO["float32"], DTYPE_MACRO["bfloat16"]),
}


# Macros the pipeline writes itself: keybias.pipeline.claims.headline_macros.
PIPELINE_MACROS: dict[str, dict[str, str]] = {
    "macros/claims.tex": cols(
        exact="ClaimsConsistency ClaimsControl ClaimsImplied ClaimsProof ClaimsTest ClaimsTestHolding "
        "ImpliedVerdicts{dtype} IndepContradictionsTotal IndepContradictions{dtype} IndepTestsTotal "
        "IndepTests{dtype}",
    ),
}

_AXIS = re.compile(r"\{(\w+)\}")


class UndeclaredMacro(KeyError):
    """A macro name no declaration produces."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class MacroDeclaration:
    """One expanded macro name: its class, the template it came from and who declared it."""

    cls: str
    template: str
    owner: str
    conditional: str | None = None  # why the committed results may lack it


def expand(template: str, axes: dict[str, tuple[str, ...]]) -> list[str]:
    """`PrecSlope{dtype}` -> one name per value of each axis it names (an unknown axis fails)."""
    names = [template]
    for axis in dict.fromkeys(_AXIS.findall(template)):
        if axis not in axes:
            raise ValueError(f"macro template {template!r} names axis {axis!r}, declared nowhere "
                             f"(axes: {', '.join(sorted(axes))})")
        names = [n.replace("{" + axis + "}", value) for n in names for value in axes[axis]]
    return names


def _declare(table: dict[str, dict[str, MacroDeclaration]], rel: str, owner: str,
             templates: dict[str, str], axes: dict[str, tuple[str, ...]],
             conditional: dict[str, tuple[str, str]] | None = None) -> None:
    entries = [(t, cls, None) for t, cls in templates.items()]
    entries += [(t, cls, why) for t, (cls, why) in (conditional or {}).items()]
    names = table.setdefault(rel, {})
    for template, cls, why in entries:
        for name in expand(template, axes):
            if name in names:
                other = names[name]
                raise ValueError(f"{rel}: macro \\{name} declared twice: by {other.template!r} "
                                 f"({other.owner}) and by {template!r} ({owner})")
            names[name] = MacroDeclaration(cls, template, owner, why)


@cache
def declared_macros() -> dict[str, dict[str, MacroDeclaration]]:
    """{macros file: {exact macro name: its declaration}}, every template expanded."""
    table: dict[str, dict[str, MacroDeclaration]] = {}
    for study in SCHEMA_STUDIES:
        module = f"keybias.studies.{study}.schema"
        schema = importlib.import_module(module)
        axes = {**AXES, **getattr(schema, "MACRO_AXES", {})}
        _declare(table, schema.MACRO_FILE, module, schema.MACROS, axes,
                 getattr(schema, "CONDITIONAL_MACROS", None))
    for rel, templates in PIPELINE_MACROS.items():
        _declare(table, rel, __name__ + ".PIPELINE_MACROS", templates, AXES)
    return table


def macro_class(rel: str, name: str) -> str:
    """The class of macro `name` in results file `rel` (`macros/03_precision.tex`), by exact
    lookup; an undeclared name raises `UndeclaredMacro` naming it."""
    declared = declared_macros()
    if name not in declared.get(rel, {}):
        owners = sorted({d.owner for d in declared.get(rel, {}).values()})
        where = f"the MACROS of {', '.join(owners)}" if owners else "a study's schema.py (MACRO_FILE, MACROS)"
        raise UndeclaredMacro(f"{rel}: macro \\{name} is not declared; declare it in {where}")
    return declared[rel][name].cls
