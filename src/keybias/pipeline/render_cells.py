"""The reader's view of each code cell: which cells and statements are plumbing to hide.

`reader_cells` decides, per code cell, whether it is hidden (parameters, `kb-hide`, code that
only records: `rec.*` calls, helpers that only record, displays of the claims just recorded),
which statements of a mixed cell are left out, and which `rec.equation` TeX is typeset under
it. `reader_output` drops raw scalar reprs and empty frames and turns Series printouts and
lists of tuples into tables. `claim_cells` finds the cell that judges each claim;
`displayed_csv` the CSV behind a displayed table; `injected_parameters` what papermill injected.
"""

from __future__ import annotations

import ast
import re

import pandas as pd

from keybias.pipeline.render_clean import (
    cell_source,
    code_cells,
    parse_code,
    plain_text,
    stream_text,
)
from keybias.studies.tables import table_html

PLUMBING_TAGS = ("parameters", "injected-parameters", "kb-hide")
_SERIES_FOOTER = re.compile(r"^(?:Name: .*, )?(?:Length: \d+, )?dtype: \w+$")
NUMBER = re.compile(r"^[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?$")


def _recorder_names(nb: dict) -> set[str]:
    names = {"rec"}
    for _, cell in code_cells(nb):
        tree = parse_code(cell_source(cell))
        for node in ast.walk(tree) if tree else []:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                func = node.value.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called == "Recorder":
                    names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _calls_recorder(node: ast.AST, names: set[str], helpers: set[str]) -> bool:
    """`rec.anything(...)` (possibly chained), or a call of a helper that only records."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in helpers
    while isinstance(func, ast.Attribute):
        func = func.value
    return isinstance(func, ast.Name) and func.id in names and isinstance(node.func, ast.Attribute)


def _loaded(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _bound(node: ast.AST) -> set[str]:
    """Names a statement binds for the code after it (a loop's own variable does not count)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, ast.For):
        return set().union(*(_bound(s) for s in node.body)) if node.body else set()
    return set()


def _mentions_claims(node: ast.AST, recorded: set[str], names: set[str]) -> bool:
    """True when an expression shows the claims bookkeeping (rec.claims, step['claims'], x_claims)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and ("claim" in n.id.lower() or n.id in recorded or n.id in names):
            return True
        if isinstance(n, ast.Attribute) and "claim" in n.attr.lower():
            return True
        if isinstance(n, ast.Constant) and n.value in ("claims", "claim_id"):
            return True
    return False


def _records(stmt: ast.stmt, names: set[str], helpers: set[str], recorded: set[str]) -> bool:
    """True for a statement that only records (or shows what was recorded), computing nothing."""
    if isinstance(stmt, ast.Expr):
        value = stmt.value
        if _calls_recorder(value, names, helpers):
            return True
        if isinstance(value, ast.Constant):
            return False
        # a display of the claims just recorded: the page's claim boxes say it for the reader
        return _mentions_claims(value, recorded, names)
    if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
        return _calls_recorder(stmt.value, names, helpers)
    if isinstance(stmt, ast.For) and not stmt.orelse:
        return all(_records(s, names, helpers, recorded) for s in stmt.body)
    if isinstance(stmt, ast.FunctionDef):
        body = [s for s in stmt.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        if body and all(_records(s, names, helpers, recorded) for s in body):
            helpers.add(stmt.name)
            return True
    return False


def _saves_figure(stmt: ast.AST) -> bool:
    """The code that makes a figure or judges a claim stays visible even though only
    `rec.figure` / `rec.claims_from` reads what it computed."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr in ("figure", "claim", "claims_from") for n in ast.walk(stmt))


def _equation_tex(call: ast.Call, literals: dict[str, str]) -> str | None:
    if not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.Name):
        return literals.get(arg.id)
    return None


PLUMBING_MODULES = ("os", "warnings")
_CONFIG_REPR = re.compile(r"^\s*[A-Z]\w*(?:Config|Settings|Params|Parameters)\(", re.DOTALL)


def _is_plumbing(stmt: ast.stmt, names: set[str]) -> bool:
    """Statements a reader never needs: the recorder's construction and import, warnings filters,
    `os.environ` settings, and the imports of modules only those use."""
    if isinstance(stmt, ast.ImportFrom) and stmt.module == "keybias.core" and all(
            a.name == "recorder" for a in stmt.names):
        return True
    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        if isinstance(func, ast.Attribute) and func.attr == "Recorder":
            return True
        if any(isinstance(t, ast.Subscript) and ast.unparse(t.value) == "os.environ" for t in stmt.targets):
            return True
    if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Subscript) and ast.unparse(t.value) == "os.environ" for t in stmt.targets):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        text = ast.unparse(stmt.value.func)
        if text.startswith(("warnings.", "os.environ.")):
            return True
    return False


def _config_names(tree: ast.Module) -> set[str]:
    """Names bound to a configuration object (`cfg = measure.XConfig(...)`)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = ast.unparse(node.value.func)
            if re.search(r"(?:Config|Settings)(?:\.\w+)?$", func):
                found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return found


def is_config_repr(text: str) -> bool:
    """A printed configuration object (`ConditionsConfig(embed_dim=32, ...)`)."""
    return bool(_CONFIG_REPR.match(text or ""))


def reader_cells(nb: dict) -> list[dict]:
    """How each cell is shown to a reader, one dict per cell (None for markdown).

    `hide`: the whole cell goes (a parameter cell, a cell tagged `kb-hide`, or code whose
    every statement records: `rec.*` calls, `x = rec.finish()`, loops over `rec.macro`, helpers
    that only record, displays of the claims just recorded). `source`: the code shown, with
    the recording statements of a mixed cell left out (unless a statement kept uses a name they
    bind). `drop_result`: the cell's execute_result is a recording call's return value or a
    claims display. `equations`: TeX of `rec.equation` calls, typeset under the cell when the
    cell does not show the math itself.
    """
    names = _recorder_names(nb)
    helpers: set[str] = set()
    config_names: set[str] = set()
    cells = nb.get("cells", [])
    plan: list[dict | None] = []
    parsed = []
    for cell in cells:
        if cell.get("cell_type") != "code":
            parsed.append(None)
            continue
        source = cell_source(cell)
        parsed.append((source, parse_code(source)))
    # names loaded by any cell: a recording statement binding one of them stays
    for index, cell in enumerate(cells):
        if parsed[index] is None:
            plan.append(None)
            continue
        source, tree = parsed[index]
        tags = set(cell.get("metadata", {}).get("tags", []))
        entry = {"hide": False, "source": source, "drop_result": False, "drop_displays": False, "equations": []}
        plan.append(entry)
        if tags & set(PLUMBING_TAGS):
            entry["hide"] = True
            continue
        if tree is None or not tree.body:
            continue
        recorded: set[str] = set()
        removed = []
        for stmt in tree.body:
            if _records(stmt, names, helpers, recorded):
                removed.append(stmt)
                # a name bound to what was recorded (`step = rec.finish()`) shows bookkeeping
                value = getattr(stmt, "value", None)
                if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                        and value.func.attr in ("finish", "claims_from", "claim", "claims")):
                    recorded |= _bound(stmt)
        config_names |= _config_names(tree)
        configs = config_names
        plumbing = [s for s in tree.body if s not in removed and (
            _is_plumbing(s, names)
            or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Name) and s.value.id in configs))]
        if not removed and not plumbing:
            continue
        kept = [s for s in tree.body if s not in removed]
        used_later = set().union(*(_loaded(s) for s in kept)) if kept else set()
        for later in parsed[index + 1:]:
            if later and later[1] is not None:
                used_later |= _loaded(later[1])
        removed = [s for s in removed if not (_bound(s) - {"_"}) & used_later]
        removed += [s for s in plumbing if s not in removed]
        # imports of os / warnings that only plumbing used
        rest = [s for s in tree.body if s not in removed]
        loads = set().union(*(_loaded(s) for s in rest if not isinstance(s, ast.Import))) if rest else set()
        for later in parsed[index + 1:]:
            if later and later[1] is not None:
                loads |= _loaded(later[1])
        for stmt in rest:
            if (isinstance(stmt, ast.Import) and all(a.name in PLUMBING_MODULES for a in stmt.names)
                    and not {a.asname or a.name for a in stmt.names} & loads):
                removed.append(stmt)
        # a TeX string only handed to rec.equation goes with it
        literals = {t.id: s.value.value for s in tree.body if isinstance(s, ast.Assign)
                    and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)
                    for t in s.targets if isinstance(t, ast.Name)}
        for stmt in removed:
            for node in ast.walk(stmt):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "equation" and _calls_recorder(node, names, helpers)):
                    tex = _equation_tex(node, literals)
                    if tex:
                        entry["equations"].append(tex)
        # an assignment whose names only the removed statements read (a TeX string for
        # rec.equation, a count for a macro) goes with them; later cells may not read it either
        later_loads = set()
        for later in parsed[index + 1:]:
            if later and later[1] is not None:
                later_loads |= _loaded(later[1])
        changed = True
        while changed:
            changed = False
            kept = [s for s in tree.body if s not in removed]
            for stmt in kept:
                others = set().union(*(_loaded(s) for s in kept if s is not stmt)) | later_loads
                names_bound = _bound(stmt) - {"_"}
                if (isinstance(stmt, ast.Assign) and names_bound and not names_bound & others
                        and any(names_bound & _loaded(r) for r in removed)
                        and not any(names_bound & _loaded(r) for r in removed if _saves_figure(r))):
                    removed.append(stmt)
                    changed = True
        kept = [s for s in tree.body if s not in removed]

        def shows(stmt):
            return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("display", "print")
                       for n in ast.walk(stmt))

        if any(shows(s) for s in removed) and not any(shows(s) for s in kept):
            entry["drop_displays"] = True
        if removed and tree.body[-1] in removed:
            entry["drop_result"] = True
        if not kept:
            entry["hide"] = True
            continue
        lines = source.splitlines()
        drop = set()
        for stmt in removed:
            start = stmt.lineno - 1
            # comment lines right above a removed statement belong to it
            while start > 0 and lines[start - 1].lstrip().startswith("#"):
                start -= 1
            drop |= set(range(start, stmt.end_lineno))
        shown = [line for number, line in enumerate(lines) if number not in drop]
        entry["source"] = re.sub(r"\n{3,}", "\n\n", "\n".join(shown)).strip("\n")
    return plan


def _literal(text: str):
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return _MISSING


_MISSING = object()


def _html_table(header: list[str] | None, rows: list[list]) -> str:
    """Rows a cell printed (a Series, a list of tuples) as a reader's table, through the one formatter."""


    width = len(rows[0]) if rows else len(header or [])
    columns = [str(h) if str(h) else f"column {i + 1}" for i, h in enumerate(header)] if header else [
        f"column {i + 1}" for i in range(width)]
    return table_html(pd.DataFrame([[_cell_value(v) for v in row] for row in rows], columns=columns))


def _cell_value(value):
    """A printed cell back to a number where it spells one, so that the formatter aligns it."""
    if isinstance(value, str) and NUMBER.match(value.strip()):
        number = float(value)
        return int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number
    return value


def _series_table(text: str) -> str | None:
    """A pandas Series printout (`value_counts` and the like) as a two-column table."""
    lines = [line for line in text.rstrip().splitlines() if line.strip()]
    if len(lines) < 2 or not _SERIES_FOOTER.match(lines[-1].strip()):
        return None
    footer = lines[-1]
    name = re.match(r"Name: (.*?), ", footer)
    body = lines[:-1]
    index_name = None
    if body and len(body[0].split()) == 1 and not NUMBER.match(body[0].strip()):
        index_name, body = body[0].strip(), body[1:]
    rows = []
    for line in body:
        parts = line.rsplit(None, 1)
        if len(parts) != 2:
            return None
        rows.append([parts[0].strip(), parts[1]])
    return _html_table([index_name or "", name.group(1) if name else "value"], rows)


def reader_output(output: dict) -> dict | None:
    """An output as a reader should see it: None to leave it out, else the output (maybe
    rewritten). Raw scalar reprs (`'1.00'`, `2900`) and empty DataFrames go; a Series printout
    or a list of tuples becomes a table."""
    if output.get("output_type") != "execute_result":
        return output
    data = output.get("data", {})
    if set(data) - {"text/plain"}:
        plain = plain_text(output)
        if plain.startswith("Empty DataFrame"):
            return None
        return output
    text = plain_text(output)
    if text.startswith("Empty DataFrame") or is_config_repr(text):
        return None
    table = _series_table(text)
    if table is None:
        value = _literal(text)
        if value is _MISSING:
            return output
        if isinstance(value, str | int | float | bool | bytes) or value is None:
            return None
        if isinstance(value, list | tuple) and value and all(isinstance(v, tuple) for v in value):
            width = len(value[0])
            if all(len(v) == width for v in value):
                table = _html_table(None, [list(v) for v in value])
        if table is None:
            return output
    return {**output, "data": {"text/html": table, "text/plain": text}}


def claim_cells(nb: dict, claims: list[dict]) -> dict[str, int]:
    """The cell that judges each claim: the first cell at or after the previous claim's that
    records claims (`.claim(`/`.claims_from(`) and names the id in its code or outputs;
    a claim named nowhere goes with the one recorded before it. Claims come in recording order."""
    recording, texts = [], {}
    for index, cell in code_cells(nb):
        source = cell_source(cell)
        if re.search(r"\.claims?(?:_from)?\(", source):
            recording.append(index)
            outputs = [stream_text(o) if o.get("output_type") == "stream"
                       else "".join(str(v) if isinstance(v, str) else "".join(v) for k, v in o.get("data", {}).items()
                                    if k.startswith("text/")) for o in cell.get("outputs", [])]
            texts[index] = source + "\n".join(outputs)
    if not recording:
        last = [i for i, _ in code_cells(nb)]
        return {c["id"]: last[-1] for c in claims} if last else {}
    found, current = {}, recording[0]
    for claim in claims:
        hit = next((i for i in recording if i >= current and claim["id"] in texts[i]), None)
        current = hit if hit is not None else current
        found[claim["id"]] = current
    return found



def displayed_csv(source: str) -> str | None:
    """The CSV of the table a cell displays: its last expression is (a selection of) a frame
    the cell also wrote with `rec.csv(frame, name)`."""
    tree = parse_code(source)
    if tree is None or not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return None
    written = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "csv"
                and len(node.args) >= 2 and isinstance(node.args[0], ast.Name)
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            written[node.args[0].id] = node.args[1].value
    node = tree.body[-1].value
    while isinstance(node, ast.Subscript | ast.Attribute | ast.Call):
        node = node.value if not isinstance(node, ast.Call) else node.func
    return written.get(node.id) if isinstance(node, ast.Name) else None


def injected_parameters(nb: dict) -> dict[str, str]:
    """The parameters papermill injected (name -> source text of the value), in order."""
    for cell in nb.get("cells", []):
        if "injected-parameters" in cell.get("metadata", {}).get("tags", []):
            source = cell_source(cell)
            tree = parse_code(source)
            if tree is None:
                return {}
            return {t.id: ast.get_source_segment(source, s.value) or "" for s in tree.body
                    if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)}
    return {}

