"""The studies: one package per notebook, each with its measure, judge and show layers.

`SCHEMA_STUDIES` names every study that declares its outputs (data columns, macros) in a
`schema.py`; the pipeline's output and macro classes read exactly these, so a new study is
registered by writing its schema.
"""

from pathlib import Path

SCHEMA_STUDIES: tuple[str, ...] = tuple(sorted(p.parent.name for p in Path(__file__).parent.glob("*/schema.py")))
