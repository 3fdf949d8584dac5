"""One figure style for the paper: readable at print size, colour-blind safe, legends outside.

The paper is single-column A4/letter with a text width of about 6.3 in, so a figure made at
`FULL_WIDTH` and included at `\\linewidth` prints at its own size; fonts set here are then the
printed sizes (all at least 7 pt). The palette is Okabe and Ito's (2008), which stays distinct
under the common forms of colour blindness.
"""

from __future__ import annotations

import matplotlib as mpl

FULL_WIDTH = 6.3  # inches: the paper's \linewidth
HALF_WIDTH = 3.1
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
    "font.size": 8.0,
    "axes.titlesize": 8.5,
    "axes.labelsize": 8.0,
    "xtick.labelsize": 7.5,
    "ytick.labelsize": 7.5,
    "legend.fontsize": 7.5,
    "legend.title_fontsize": 7.5,
    "figure.titlesize": 9.0,
    "axes.prop_cycle": mpl.cycler(color=OKABE_ITO),
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "pdf.fonttype": 42,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def apply() -> None:
    """Set the paper's rcParams; call once before making figures."""
    mpl.rcParams.update(RC)


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
    return ax_or_fig.legend(**kwargs)


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
