"""One figure style for the paper: readable at print size, colour-blind safe, legends outside.

The paper is single-column US letter with 1 in margins, so its `\\linewidth` is 6.5 in (the paper
writes the value it was set with into main.aux, and tests/pipeline/test_paper.py checks it against
`FULL_WIDTH`). A figure made at `FULL_WIDTH` and included at `width=\\linewidth` prints at its own
size, so the fonts set here (8-9 pt, never below `MIN_FONT_PT`) are the printed sizes. Figures are
saved with a tight bounding box, so anything drawn outside the figure (a legend wider than it) would
widen the saved figure and shrink every font when LaTeX scales it back to `\\linewidth`:
`legend_outside` therefore keeps a figure legend no wider than the figure. The palette is Okabe
and Ito's (2008), which stays distinct under the common forms of colour blindness.
"""

from __future__ import annotations

import matplotlib as mpl
import matplotlib._mathtext as mathtext

FULL_WIDTH = 6.5  # inches: the paper's \linewidth (letter paper, 1 in margins)
HALF_WIDTH = 3.15  # two side by side with a small gap
MIN_FONT_PT = 7.0
OKABE_ITO = (
    "#0072B2",  # blue
    "#E69F00",  # orange
    "#009E73",  # bluish green
    "#D55E00",  # vermillion
    "#CC79A7",  # reddish purple
    "#56B4E9",  # sky blue
    "#F0E442",  # yellow
    "#000000",  # black
)
RC = {
    "font.size": 8.5,
    "axes.titlesize": 9.0,
    "axes.labelsize": 8.5,
    "xtick.labelsize": 8.0,
    "ytick.labelsize": 8.0,
    "legend.fontsize": 8.0,
    "legend.title_fontsize": 8.0,
    "figure.titlesize": 9.0,
    "axes.prop_cycle": mpl.cycler(color=OKABE_ITO),
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "pdf.fonttype": 42,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


SCRIPT_SHRINK = 0.85


def apply() -> None:
    """Set the paper's rcParams; call once before making figures."""
    mpl.rcParams.update(RC)
    # mathtext draws exponents and subscripts at 0.7 of the text: 5.6 pt on 8-pt tick labels of a
    # log axis. No rcParam sets it, so the pinned matplotlib's module constant is raised to 0.85
    # (6.8 pt), which keeps them readable in print; the test of the style checks it took effect.
    mathtext.SHRINK_FACTOR = SCRIPT_SHRINK


def legend_outside(ax_or_fig, **kwargs):
    """Put the legend to the right of the axes (or below the figure), never over the data."""
    if hasattr(ax_or_fig, "legend") and hasattr(ax_or_fig, "transAxes"):
        kwargs.setdefault("loc", "upper left")
        kwargs.setdefault("bbox_to_anchor", (1.01, 1.0))
        kwargs.setdefault("borderaxespad", 0.0)
        return ax_or_fig.legend(**kwargs)
    kwargs.setdefault("loc", "lower center")
    kwargs.setdefault("bbox_to_anchor", (0.5, 1.0))
    kwargs.setdefault("ncol", 4)
    return _fit_figure_legend(ax_or_fig, kwargs)


def _fit_figure_legend(fig, kwargs):
    """A figure legend with as many columns as fit the figure's width (fewer columns, more rows)."""
    ncol = max(1, int(kwargs.pop("ncol")))
    while True:
        legend = fig.legend(ncol=ncol, **kwargs)
        if ncol == 1:
            return legend
        renderer = fig.canvas.get_renderer()
        width_in = legend.get_window_extent(renderer).width / fig.dpi
        if width_in <= 0.98 * fig.get_figwidth():
            return legend
        legend.remove()
        ncol -= 1


def smallest_font_pt(fig) -> float:
    """The smallest font size (points) of any visible text in `fig`, at the figure's own size.

    Figures are made at the printed width, so this is the size on paper.
    """
    sizes = [
        t.get_fontsize()
        for t in fig.findobj(mpl.text.Text)
        if t.get_visible() and t.get_text().strip()
    ]
    return min(sizes) if sizes else float("inf")
