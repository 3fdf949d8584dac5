"""The fix in mha_causal_slots.patch, applied at test time without touching installed files.

`patched_function()` reads the installed torch/nn/functional.py, applies the hunks of
mha_causal_slots.patch to its text (strictly: every context and removed line must match at the
stated line, else PatchDoesNotApply), and compiles the patched `multi_head_attention_forward`
in a copy of torch.nn.functional's namespace. The function that is tested is therefore exactly
the pinned source plus the diff, and the diff is the one to review upstream.

`applied()` is a context manager that puts the patched function in place of
`torch.nn.functional.multi_head_attention_forward` (which nn.MultiheadAttention calls as
`F.multi_head_attention_forward`) and restores the stock one on exit.
"""

from __future__ import annotations

import ast
import contextlib
import linecache
import re
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

PATCH = Path(__file__).resolve().with_name("mha_causal_slots.patch")
PINNED_TORCH = "2.13.0"
FUNCTION = "multi_head_attention_forward"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchDoesNotApply(RuntimeError):
    """The patch's context does not match the installed torch/nn/functional.py."""


def apply_unified_diff(text: str, diff: str) -> str:
    """Apply a one-file unified diff to `text`, with no fuzz and no offset."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    pos = 0  # index into `lines` of the next line not yet copied
    hunks = 0
    diff_lines = diff.splitlines(keepends=True)
    i = 0
    while i < len(diff_lines):
        m = _HUNK.match(diff_lines[i])
        i += 1
        if not m:
            continue
        hunks += 1
        start = int(m.group(1)) - 1 if m.group(2) != "0" else int(m.group(1))
        if start < pos:
            raise PatchDoesNotApply(f"hunk {hunks} overlaps the one before it")
        out.extend(lines[pos:start])
        pos = start
        while i < len(diff_lines) and not diff_lines[i].startswith("@@"):
            line = diff_lines[i]
            i += 1
            if line.startswith("\\"):  # "\ No newline at end of file"
                continue
            tag, body = line[:1], line[1:]
            if tag in (" ", "-"):
                if pos >= len(lines) or lines[pos] != body:
                    found = lines[pos] if pos < len(lines) else "<end of file>"
                    raise PatchDoesNotApply(
                        f"hunk {hunks}, line {pos + 1}: expected {body!r}, found {found!r}")
                pos += 1
                if tag == " ":
                    out.append(body)
            elif tag == "+":
                out.append(body)
            else:
                raise PatchDoesNotApply(f"hunk {hunks}: unexpected diff line {line!r}")
    if hunks == 0:
        raise PatchDoesNotApply("no hunks in the patch")
    out.extend(lines[pos:])
    return "".join(out)


def patched_source() -> str:
    """The text of torch/nn/functional.py with mha_causal_slots.patch applied."""
    installed = Path(F.__file__)
    return apply_unified_diff(installed.read_text(encoding="utf-8"),
                              PATCH.read_text(encoding="utf-8"))


def patched_function():
    """The patched multi_head_attention_forward, compiled from the patched source text."""
    if torch.__version__.split("+")[0] != PINNED_TORCH:
        raise PatchDoesNotApply(
            f"the patch is written against torch=={PINNED_TORCH}; this is torch {torch.__version__}")
    source = patched_source()
    tree = ast.parse(source)
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == FUNCTION), None)
    if node is None:
        raise PatchDoesNotApply(f"no top-level {FUNCTION} in the patched source")
    lines = source.splitlines(keepends=True)
    first = node.lineno - 1 - len(node.decorator_list)
    # Blank lines in front keep the line numbers of the patched file in tracebacks.
    function_source = "\n" * first + "".join(lines[first:node.end_lineno])
    filename = "<torch/nn/functional.py + upstream/mha_causal_slots.patch>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace = dict(vars(F))
    exec(compile(function_source, filename, "exec", dont_inherit=True), namespace)
    fn = namespace[FUNCTION]
    fn.__module__ = F.__name__
    return fn


@contextlib.contextmanager
def applied() -> Iterator[object]:
    """Within the block, torch.nn.functional.multi_head_attention_forward is the patched one."""
    stock = F.multi_head_attention_forward
    fn = patched_function()
    F.multi_head_attention_forward = fn
    try:
        yield fn
    finally:
        F.multi_head_attention_forward = stock
