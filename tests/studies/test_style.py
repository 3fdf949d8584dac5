"""The figure style: exponents of log-axis tick labels stay readable at print size."""

from matplotlib.font_manager import FontProperties
from matplotlib.mathtext import MathTextParser

from keybias.studies import style


def _smallest_glyph_pt(tex: str, size: float) -> float:
    parsed = MathTextParser("path").parse(tex, prop=FontProperties(size=size))
    return min(g[1] for g in parsed.glyphs)


def test_tick_exponents_print_at_least_six_and_a_half_points():
    style.apply()
    # a string no other test parses, so mathtext's cache cannot answer with an earlier layout
    exponent = _smallest_glyph_pt(r"$10^{-7}\,\,$", style.RC["xtick.labelsize"])
    assert exponent >= 6.5, f"a tick label's exponent prints at {exponent:.1f} pt"
