"""One table formatter for every page: notebooks call `show_table`, the renderer `tidy_table_html`.

A table for a reader has no index column, headers in words (PyTorch keywords stay as code),
numbers right-aligned with thousands separators and 3 significant figures, "—" for a missing
value, and whole text: nothing is masked or cut. A long table shows its first rows and links
to the CSV that holds every row (a table without one is shown whole).
"""

from __future__ import annotations

import html
import math
import re

import numpy as np
import pandas as pd

from keybias.core.text import SUPERSCRIPT

MISSING = "\u2014"
COMPARISONS = {"<=": "\u2264", ">=": "\u2265", "!=": "\u2260", "==": "="}
MAX_ROWS = 25
WIDE_COLUMNS = 4  # a table with more columns reads as one card per row on a phone
# column names that are PyTorch keywords (the sweep tables' axes): shown as code, not as words
# (the options whose effect the studies measure); sizes and training settings read as words
KEYWORDS = frozenset({
    "batch_first", "bias", "add_bias_kv", "add_zero_attn", "need_weights", "dtype", "is_causal", "attn_mask",
    "key_padding_mask", "average_attn_weights",
})
SETTING_WORDS = {"embed_dim": "Width E", "num_heads": "Heads", "kdim": "Key width", "vdim": "Value width",
                 "dropout": "Dropout", "device": "Device", "model_type": "Model type", "eps": "Adam's \u03b5",
                 "lr": "Learning rate"}
# abbreviations in column names, spelled out for a reader
ABBREVIATIONS = {"se": "standard error", "pred": "predicted", "resid": "residual", "const": "constant",
                 "cos": "cosine", "eff": "effective", "dev": "deviation", "err0": "error without b_k",
                 "err": "error", "reps": "repetitions", "params": "parameters", "frac": "fraction",
                 "std": "standard deviation", "avg": "average", "seconds_share": "share of seconds",
                 "diff": "difference", "rel": "relative", "abs": "absolute", "sgd": "SGD", "Sgd": "SGD",
                 "ffn": "FFN", "Ffn": "FFN", "seq": "sequence", "Seq": "Sequence", "gpu": "GPU", "Gpu": "GPU",
                 "fro": "Frobenius norm", "sqrt": "\u221a", "Wk": "W_k", "din": "d_in", "sdpa": "SDPA",
                 "Sdpa": "SDPA", "kv": "key-value", "lr": "learning rate"}
# the words a verdict value is shown as (the data keep the identifiers the design names)
# (the attention code paths of the precision sweeps are named in words, as the paper names them)
PATH_WORDS = {"explicit": "explicit attention", "sdpa_math": "SDPA math path", "sdpa_flash": "flash kernel",
              "sdpa_efficient": "memory-efficient kernel"}
# an invariance case (invariance.judge.category) in words, for the figure's rows, the verdict table
# and the claims that name it
CASE_WORDS = {
    "MHA plain": "MHA, plain",
    "MHA shapes": "MHA, shapes",
    "MHA sizes": "MHA, sizes",
    "MHA dropout": "MHA, attention dropout",
    "MHA kdim_vdim": "MHA, own key and value widths",
    "MHA bias_false": "MHA without biases",
    "MHA fully masked row": "MHA, fully masked row",
    "MHA add_bias_kv": "MHA, appended key slot",
    "MHA add_zero_attn": "MHA, zero slot",
    "MHA add_bias_kv_zero_attn": "MHA, appended and zero slots",
    "MHA single key plain": "MHA, one key",
    "MHA single key add_zero_attn": "MHA, one key and a zero slot",
    "realistic plain": "large MHA, plain",
    "realistic kdim_vdim": "large MHA, own widths",
    "realistic add_bias_kv": "large MHA, appended slot",
    "realistic add_zero_attn": "large MHA, zero slot",
    "realistic add_bias_kv_zero_attn": "large MHA, both slots",
    "SDPA MATH": "SDPA, math backend",
    "SDPA FLASH_ATTENTION": "SDPA, flash backend",
    "SDPA EFFICIENT_ATTENTION": "SDPA, memory-efficient backend",
    "SDPA CUDNN_ATTENTION": "SDPA, cuDNN backend",
    "encoder_layer": "Transformer encoder layer",
    "decoder_layer_self": "Transformer decoder, self-attention",
    "decoder_layer_cross": "Transformer decoder, cross-attention",
    "transformer": "nn.Transformer",
    "variant softmax": "written out, softmax",
    "variant alibi": "ALiBi",
    "variant rope": "rotary embeddings",
    "variant qk_norm": "QK-norm",
    "variant cosine": "cosine attention",
    "variant sigmoid": "sigmoid attention",
    "variant sink_logit": "learned sink logit",
    "variant sink_key": "learned sink key",
    "HF bert": "BERT (Hugging Face)",
    "HF roberta": "RoBERTa (Hugging Face)",
    "HF gpt2": "GPT-2 (Hugging Face)",
    "HF vit": "ViT (Hugging Face)",
    "HF whisper": "Whisper (Hugging Face)",
    "HF qwen2": "Qwen2 (Hugging Face)",
    "device cuda": "CUDA: not measured on the CPU (see the GPU appendix)",
    "device mps": "MPS: not measured (no MPS device available)",
}
VALUE_WORDS = {"not_redundant": "not redundant", **PATH_WORDS, **CASE_WORDS}

# the invariance sweep's identifiers in words, per column: one identifier means different things in
# different columns ("sdpa" is a family and a code path), so these are not in VALUE_WORDS.
# The CSV files keep the identifiers
COLUMN_WORDS = {
    "status": {"measured": "measured", "rejected": "rejected by PyTorch", "absent_device": "device absent",
               "no_key_bias": "no key bias"},
    "family": {"mha": "MHA", "sizes": "MHA sizes", "realistic": "large MHA", "layers": "Transformer layers",
               "sdpa": "SDPA", "variants": "reference variants", "hf": "Hugging Face"},
    "code_path": {"mha_fast_path": "MHA fast path", "slow_path_sdpa": "MHA through SDPA",
                  "slow_path_sdpa(layer)": "layer's MHA through SDPA",
                  "slow_path_explicit_softmax": "MHA, softmax written out", "explicit_softmax": "softmax written out",
                  "sdpa": "SDPA called directly"},
    "sdpa_backend_used": {"MATH": "math", "FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "memory-efficient",
                          "CUDNN_ATTENTION": "cuDNN", "native": "the fast path's own kernel", "none": "no SDPA"},
    "masked_row_output": {"nan": "NaN", "out_proj_bias": "the output projection's bias",
                          "appended_slots": "the appended key slots alone", "other": "something else"},
    # the joint verdict (b_k with the appended key slot) of a category: one or more verdicts
    "joint": {"redundant": "redundant", "not_redundant": "not redundant", "invalid": "no power",
              "--": "\u2014"},
}


def category_label(category: str) -> str:
    """A configuration category in words (underscores never reach the reader)."""
    return CASE_WORDS.get(category, str(category).replace("_", " "))


def in_words(frame: pd.DataFrame) -> pd.DataFrame:
    """A table's identifiers in words: invariance categories as the map labels them, the columns of
    COLUMN_WORDS (comma lists part by part), and a count "3/4" as "3 of 4" ("0/0", nothing judged,
    as a dash)."""
    frame = frame.copy()
    if "category" in frame:
        frame["category"] = frame["category"].map(category_label)
    for column, words in COLUMN_WORDS.items():
        if column in frame:
            frame[column] = frame[column].map(lambda v, w=words: ", ".join(
                w.get(part, part.replace("_", " ")) for part in str(v).split(",")))
    if "matches_theory" in frame:
        frame["matches_theory"] = frame["matches_theory"].map(
            lambda v: MISSING if v == "0/0" else str(v).replace("/", " of "))
    return frame


def case_words(case: str) -> str:
    """An invariance case ("variant qk_norm", "encoder_layer") as a sentence begins it."""
    text = CASE_WORDS.get(case, case.replace("_", " "))
    return text[:1].upper() + text[1:]
# TeX in a cell ("$b_q$ tied to $b_k$") is left whole for MathJax: a break inside it would stop typesetting
_INLINE_MATH = re.compile(r"\$[^$]+\$")
_NUMBER = re.compile(r"^[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?$")
_BIAS = re.compile(r"\bb_([kqvo])\b")
# a symbol with a short subscript in a header (b_k, W_k, d_in) and log10, as a reader writes them
_SUBSCRIPT = re.compile(r"(?<![\w])([A-Za-z])_([a-z]{1,3}|\d)(?![\w])")
_UNICODE_SUB = {"k": "\u2096", "v": "\u1d65", "o": "\u2092", "in": "\u1d62\u2099", "0": "\u2080", "1": "\u2081"}


def is_missing(value) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    if isinstance(value, str) and value.strip() in ("", "nan", "NaN", "None", "--", "<NA>", "NaT"):
        return True
    try:
        return bool(pd.isna(value)) if not isinstance(value, list | tuple | dict) else False
    except (TypeError, ValueError):
        return False


def format_number(value, digits: int = 3) -> str:
    """A number for reading: integers with thousands separators, others to `digits` significant
    figures (scientific as 1.2×10⁻³ outside 10⁻³…10⁶), "—" when missing; anything else as text."""
    if is_missing(value):
        return MISSING
    if _is_bool(value):
        return "yes" if value else "no"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isinf(number):
        return "\u221e" if number > 0 else "\u2212\u221e"
    if number == int(number) and abs(number) < 1e15 and (isinstance(value, int) or abs(number) < 1e6):
        text = f"{int(number):,}"
    elif number != 0 and not 1e-3 <= abs(number) < 1e6:
        mantissa, exponent = f"{number:.{digits - 1}e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
        text = f"{mantissa}\u00d710{str(int(exponent)).translate(SUPERSCRIPT)}"
    else:
        places = max(0, digits - 1 - math.floor(math.log10(abs(number)))) if number else 0
        text = f"{number:,.{places}f}"
    return text.replace("-", "\u2212", 1) if text.startswith("-") else text


def is_number(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return True
    return isinstance(value, np.number) and not isinstance(value, np.bool_)


def _is_bool(value) -> bool:
    if isinstance(value, bool):
        return True
    return isinstance(value, np.bool_)


def header_text(name) -> str:
    """A column name for a reader: snake_case to words; PyTorch keywords and b_k stay as code."""
    name = str(name)
    if name in KEYWORDS:
        return name
    if name in SETTING_WORDS:
        return SETTING_WORDS[name]
    words = re.sub(r"(?<![A-Za-z])b_([kqvo])(?![A-Za-z])", r"b@\1", name).replace("_", " ").replace("b@", "b_")
    words = " ".join(words.split())
    words = re.sub(r"\bnum\b|^n\b", "number of", words)
    words = re.sub(r"\bacc\b", "accuracy", words)
    words = re.sub(r"\bmax\b", "largest", words)
    words = re.sub(r"\brms\b", "RMS", words)
    words = re.sub(r"\bgrad\b", "gradient", words)
    words = re.sub(r"\b(?:B|b)([kqvo])\b", r"b_\1", re.sub(r"^b([kqvo])\b", r"b_\1", words))
    words = re.sub(r"\bdim\b", "dimension", words)
    for short, long in ABBREVIATIONS.items():
        words = re.sub(rf"\b{short}\b", long, words)
    words = re.sub(r"\bmin\b", "smallest", words)
    words = re.sub(r"\btol\b", "tolerance", words)
    words = re.sub(r"\blen\b", "length", words)
    words = re.sub(r"\btgt\b", "target", words)
    words = re.sub(r"\bsrc\b", "source", words)
    words = re.sub(r"\bci\b", "interval", words)
    words = re.sub(r"\bus\b", "(\u00b5s)", words).replace("\u221a ", "\u221a")
    if not words or re.match(r"[A-Za-z]_\w", words):
        return words
    return words[:1].upper() + words[1:]


def header_html(name, given: str | None = None) -> str:
    """A column's header as HTML: `header_text` (or the `given` words), PyTorch keywords as code,
    b_k, W_k and d_in with subscripts and log10 as log with subscript 10, as the paper writes them."""
    if given is None and str(name) in KEYWORDS:
        return f"<code>{html.escape(str(name))}</code>"
    text = html.escape(header_text(name) if given is None else str(given))
    text = _SUBSCRIPT.sub(r"<i>\1</i><sub>\2</sub>", text)
    return re.sub(r"\blog10\b", "log<sub>10</sub>", text)


def header_label(name, given: str | None = None) -> str:
    """The same header as plain text (a phone shows it before each cell of a wide table): the
    subscripts Unicode has as subscripts (b\u2096, d\u1d62\u2099), the others as b_q."""
    text = str(name) if given is None and str(name) in KEYWORDS else (header_text(name) if given is None else str(given))
    text = _SUBSCRIPT.sub(lambda m: m.group(1) + _UNICODE_SUB[m.group(2)] if m.group(2) in _UNICODE_SUB
                          else m.group(0), text)
    return re.sub(r"\blog10\b", "log\u2081\u2080", text)


def whole_clauses(text: str, cut_at: int | None = None) -> str:
    """Text that was cut at about `cut_at` characters, back to its last whole clause (never
    mid-word); shorter text unchanged."""
    text = str(text)
    if cut_at is None or len(text) < cut_at:
        return text
    ends = [text.rfind(mark) for mark in ("; ", ". ", ", ")]
    end = max(ends)
    if end > 20:
        return text[:end].rstrip(",;.") + "."
    return text.rsplit(" ", 1)[0] + " \u2026"


def breakable(escaped: str) -> str:
    """Escaped text with a line-break opportunity after each underscore, so that identifiers
    (`not_redundant`, `add_bias_kv`) wrap on a phone instead of widening the table."""
    if _INLINE_MATH.search(escaped):  # TeX stays whole for MathJax; only the text around it breaks
        return "$".join(part if i % 2 else part.replace("_", "_<wbr>") for i, part in enumerate(escaped.split("$")))
    return escaped.replace("_", "_<wbr>")


def _frame(frame):
    if not isinstance(frame, pd.DataFrame):
        frame = pd.DataFrame(frame)
    index = frame.index
    if all(name is None for name in index.names):
        # an unnamed index is row numbering (kept by a filter or a sort), never data
        if not pd.api.types.is_integer_dtype(index.dtype) and not isinstance(index, pd.RangeIndex):
            return frame.reset_index()
        return frame.reset_index(drop=True)
    return frame.reset_index()


def table_html(frame, *, csv: str | None = None, max_rows: int = MAX_ROWS, caption: str | None = None,
               headers: dict | None = None, columns: list | None = None) -> str:
    """The HTML of a reader's table (see the module docstring); `csv` is a stem in results/data/,
    `columns` the columns shown of a table too wide to read whole (the CSV holds every column)."""
    frame = _frame(frame)
    headers = headers or {}
    e = html.escape
    all_columns = len(frame.columns)
    if columns is not None:
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise KeyError(f"show_table: no column {', '.join(map(str, missing))} in this table")
        if not csv:
            raise ValueError("show_table: a table shown without some of its columns needs the csv that has them all")
        frame = frame[list(columns)]
    columns = list(frame.columns)
    numeric = {c: all(is_number(v) or is_missing(v) for v in frame[c]) and not all(is_missing(v) for v in frame[c])
               for c in columns}
    labels = {c: header_label(c, headers.get(c)) for c in columns}
    head = "".join(
        f'<th class="{"kb-num" if numeric[c] else "kb-text"}" scope="col">{header_html(c, headers.get(c))}</th>'
        for c in columns)
    # a long table is cut only where the CSV that holds every row can be linked; without one it
    # is shown whole, so that no row is lost
    trimmed = bool(csv) and len(frame) > max_rows
    shown = frame.head(max_rows) if trimmed else frame
    rows = []
    for _, row in shown.iterrows():
        cells = []
        for c in columns:
            value = row[c]
            if numeric[c]:
                cells.append(f'<td class="kb-num" data-label="{e(labels[c])}">{e(format_number(value))}</td>')
            else:
                if isinstance(value, str) and value.strip().lower() == "nan":
                    text = "NaN"  # a category that names a NaN result, not a missing value
                else:
                    text = MISSING if is_missing(value) else (
                        format_number(value) if is_number(value) or _is_bool(value) else str(value))
                text = VALUE_WORDS.get(text, COMPARISONS.get(text, text))
                cells.append(f'<td class="kb-text" data-label="{e(labels[c])}">{breakable(e(text))}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    note = ""
    narrowed = len(columns) < all_columns
    if trimmed or narrowed:
        shown_part = " and ".join(part for part in (
            f"the first {max_rows} of {len(frame):,} rows" if trimmed else "",
            f"{len(columns)} of {all_columns} columns" if narrowed else "") if part)
        every = "every row and column" if trimmed and narrowed else ("every row" if trimmed else "every column")
        note = (f'<p class="kb-trimmed">{shown_part[:1].upper() + shown_part[1:]}; {every} is in '
                f'<a href="../data/{e(csv)}.csv">the CSV file</a>.</p>')
    elif csv:
        note = f'<p class="kb-trimmed"><a href="../data/{e(csv)}.csv">This table as a CSV file</a>.</p>'
    cap = f"<caption>{e(caption)}</caption>" if caption else ""
    wide = " kb-wide" if len(columns) > WIDE_COLUMNS else ""
    return (f'<div class="kb-table"><table class="kb-tidy{wide}">{cap}<thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>{note}')


class Table:
    """What `show_table` returns: Jupyter shows its HTML; its text form is the same table, plain."""

    def __init__(self, frame, **options):
        self.frame = _frame(frame)
        self.options = options

    def _repr_html_(self) -> str:
        return table_html(self.frame, **self.options)

    def __repr__(self) -> str:
        shown = self.frame[list(self.options["columns"])] if self.options.get("columns") else self.frame
        shown = shown.head(self.options.get("max_rows", MAX_ROWS)) if self.options.get("csv") else shown
        return shown.map(lambda v: format_number(v) if is_number(v) or is_missing(v) else str(v)).to_string(index=False)


def show_table(frame, *, csv: str | None = None, max_rows: int = MAX_ROWS, caption: str | None = None,
               headers: dict | None = None, columns: list | None = None) -> Table:
    """A DataFrame as a reader's table: the last expression of a notebook cell.

    `csv`: the stem of the CSV in results/data/ that holds every row (linked under the table);
    `headers`: column names to show instead of the generated ones;
    `columns`: the columns to show of a table too wide to read whole (needs `csv`, which has them all).
    """
    table = Table(frame, csv=csv, max_rows=max_rows, caption=caption, headers=headers, columns=columns)
    table._repr_html_()  # a missing column or a narrowed table without its CSV fails here, in the cell
    return table


def _plain_header(th) -> str:
    """A header cell's text with its subscripts as `header_label` writes them (b\u2096, b_q)."""
    parts = []
    for node in th.descendants:
        if isinstance(node, str) and not (node.parent.name == "sub"):
            parts.append(str(node))
        elif getattr(node, "name", None) == "sub":
            sub = node.get_text()
            parts.append("\u2081\u2080" if sub == "10" else _UNICODE_SUB.get(sub, "_" + sub))
    text = " ".join("".join(parts).split())
    return _SUBSCRIPT.sub(lambda m: m.group(1) + _UNICODE_SUB[m.group(2)] if m.group(2) in _UNICODE_SUB
                          else m.group(0), text)


def _label_cells(table) -> int:
    """Give each body cell its column's header as `data-label` (a phone shows a wide table as one
    card per row) and mark a table of more than WIDE_COLUMNS columns `kb-wide`; the column count."""
    head = table.find("thead")
    rows = head.find_all("tr", recursive=False) if head else []
    labels = [_plain_header(th) for th in rows[-1].find_all(["th", "td"], recursive=False)] if rows else []
    body = table.find("tbody")
    for row in (body.find_all("tr", recursive=False) if body else []):
        cells = row.find_all(["td", "th"], recursive=False)
        if labels and len(cells) == len(labels):
            for cell, label in zip(cells, labels, strict=True):
                cell["data-label"] = label
    if len(labels) > WIDE_COLUMNS and "kb-wide" not in (table.get("class") or []):
        table["class"] = [*(table.get("class") or []), "kb-wide"]
    return len(labels)


def _as_number(text: str):
    """The number a cell's text spells, or None (a name such as E5 that only looks like one)."""
    raw = text.replace(",", "")
    try:
        return int(raw) if re.fullmatch(r"[-+]?\d+", raw) else float(raw)
    except ValueError:
        return None


def tidy_table_html(table, soup) -> None:
    """Rewrite a pandas-rendered `<table>` (a BeautifulSoup node) in place to the reader's form:
    the index column dropped when it is a plain row number, headers in words, numbers formatted
    and right-aligned, missing values as "—". Tables `table_html` made are left as they are."""
    if "kb-tidy" in (table.get("class") or []):
        _label_cells(table)
        return
    head = table.find("thead")
    body = table.find("tbody")
    rows = body.find_all("tr", recursive=False) if body else table.find_all("tr")
    # a plain row-number index: every body row starts with a <th> holding an integer
    first = [r.find(["th", "td"], recursive=False) for r in rows]
    plain_index = bool(rows) and all(
        c is not None and c.name == "th" and re.fullmatch(r"\d+", c.get_text().strip()) for c in first)
    if plain_index:
        for c in first:
            c.decompose()
        if head:
            for hr in head.find_all("tr", recursive=False):
                cells = hr.find_all(["th", "td"], recursive=False)
                if cells:
                    cells[0].decompose()
    if head:
        for hr in head.find_all("tr", recursive=False):
            for th in hr.find_all(["th", "td"], recursive=False):
                text = th.get_text().strip()
                th.clear()
                from bs4 import BeautifulSoup

                th.append(BeautifulSoup(header_html(text), "html.parser"))
    for row in rows:
        for cell in row.find_all(["td", "th"], recursive=False):
            text = cell.get_text().strip()
            if is_missing(text):
                cell.string = MISSING
            elif _NUMBER.match(text) and re.search(r"\d", text) and _as_number(text) is not None:
                cell.string = format_number(_as_number(text))
                cell["class"] = [*(cell.get("class") or []), "kb-num"]
            elif text in ("True", "False"):
                cell.string = "yes" if text == "True" else "no"
            elif text in COMPARISONS or text in VALUE_WORDS:
                cell.string = VALUE_WORDS.get(text, COMPARISONS.get(text))
            elif "_" in text and cell.name == "td" and not cell.find(True) and not _INLINE_MATH.search(text):
                cell.clear()
                for i, part in enumerate(text.split("_")):
                    if i:
                        cell.append("_")
                        cell.append(soup.new_tag("wbr"))
                    cell.append(part)
                cell["class"] = [*(cell.get("class") or []), "kb-text"]
            elif cell.name == "td":
                cell["class"] = [*(cell.get("class") or []), "kb-text"]
    table["class"] = [*(table.get("class") or []), "kb-tidy"]
    _label_cells(table)
