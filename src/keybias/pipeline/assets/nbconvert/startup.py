"""Run by every notebook kernel at start (PYTHONSTARTUP, set in keybias.pipeline.kernel): pandas
shows whole cell text (no cut at 50 characters) and every column; the rendered page wraps long
text and trims long tables itself, with a link to the CSV."""

try:
    import pandas as _pd
except ImportError:  # a kernel without pandas shows no tables
    pass
else:
    _pd.set_option("display.max_colwidth", None)
    _pd.set_option("display.max_columns", None)
    _pd.set_option("display.width", 200)
