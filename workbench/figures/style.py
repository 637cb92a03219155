"""How every figure looks: a print-friendly template, a colour-blind-safe palette and the provenance footer.

    fig = go.Figure(...)
    apply_style(fig, title="...", provenance=workspace.provenance(names))   # a store.manifest.Provenance

The palette is Okabe and Ito's colours (their yellow, unreadable on white paper, swapped for
wine), distinguishable with the common colour-vision deficiencies; sequential scales are cividis. Every
exported figure carries a footer naming the runs, their configs, the store's schema
version and the code revision, so a figure cut out of a report still says where it came from.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

from workbench.store.manifest import Provenance

PALETTE: tuple[str, ...] = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#882255")
SEQUENTIAL = "Cividis"
EQUAL_COLOUR = "#e8e8e8"
"""Background of a heatmap where runs are bitwise equal."""
FLOOR_COLOUR = "rgba(120, 120, 120, 0.22)"
SEED_COLOUR = "rgba(86, 180, 233, 0.18)"
"""The seed-to-seed spread's band (the palette's sky blue, lighter than the noise floor's grey)."""
BAND_EDGES = {FLOOR_COLOUR: "rgb(120, 120, 120)", SEED_COLOUR: "rgb(86, 180, 233)"}
"""Each band's colour made opaque: the dotted line of a band of no width."""
NOISE_FLOOR = "noise floor (repeats)"
SEED_SPREAD = "seed-to-seed spread"
FONT_SIZE = 13
FONT = dict(family="DejaVu Sans, Arial, sans-serif", size=FONT_SIZE, color="#222222")
TEMPLATE = "workbench"
"""plotly_white's layout and its defaults for the trace types the figures use: every figure copies its
template, and plotly_white's defaults for all 24 trace types take ~0.1 s to copy (this one ~0.01 s)."""
_TRACE_TYPES = ("scatter", "scattergl", "heatmap", "bar")
pio.templates[TEMPLATE] = go.layout.Template(
    layout=pio.templates["plotly_white"].layout,
    data={kind: getattr(pio.templates["plotly_white"].data, kind) for kind in _TRACE_TYPES})


def footer(provenance: Provenance) -> str:
    """The provenance footer's text: which runs, which configs, which schema and code revision."""
    return "<br>".join(provenance.lines())


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


DASHES: tuple[str, ...] = ("solid", "dash", "dot", "dashdot")
"""With ``PALETTE``: the line styles of one figure's runs, len(PALETTE) x len(DASHES) = 32 before one repeats."""


def line_style(index: int) -> dict[str, str]:
    """The colour and dash of the ``index``-th run of a figure: the palette's colours first, solid; then again,
    dashed; and so on, so that no two of a figure's first 32 runs look alike."""
    return dict(color=PALETTE[index % len(PALETTE)], dash=DASHES[index // len(PALETTE) % len(DASHES)])


LEGEND_ENTRY_PX = 22
"""The height of one line of a vertical legend at ``FONT_SIZE`` (plotly's is about 1.6 font sizes)."""


def legend_entries(fig: go.Figure) -> int:
    """The entries of ``fig``'s legend: its named traces shown there, one per legend group."""
    shown = fig.layout.showlegend if fig.layout.showlegend is not None else len(fig.data) > 1  # plotly's default
    return len({t.legendgroup or id(t) for t in fig.data if t.showlegend is not False and t.name}) if shown else 0


def legend_height(fig: go.Figure) -> int:
    """The least height (pixels) at which ``fig``'s vertical legend fits beside its plot, margins included:
    plotly cuts a legend taller than the plot from a static export."""
    margin = fig.layout.margin
    return (margin.t or 0) + (margin.b or 0) + LEGEND_ENTRY_PX * legend_entries(fig)


_FOOTER_SIZE = 9
"""Font size (px) of the provenance footer."""


def apply_style(fig: go.Figure, *, title: str, provenance: Provenance | None = None, height: int = 520,
                width: int | None = None, room_below: int = 0) -> go.Figure:
    """Title, fonts, margins, white background and the provenance footer; returns ``fig``. ``room_below``:
    pixels more between the plot and the footer (an x axis title of two lines)."""
    bottom = (95 if provenance is not None else 60) + room_below
    text = ""
    if provenance is not None:  # wrapped to the figure's width (plotly's default 700 px where none is set)
        text = _wrap(footer(provenance), int(((width or 700) - 70) / (_FOOTER_CHAR_EM * _FOOTER_SIZE)))
        bottom += round(1.3 * _FOOTER_SIZE * (text.count("<br>") - 1))
    fig.update_layout(template=TEMPLATE, font=FONT, title=dict(text=title, x=0.01, xanchor="left"),
                      height=height, width=width, margin=dict(l=70, r=30, t=60, b=bottom), colorway=list(PALETTE),
                      legend=dict(bgcolor="rgba(255,255,255,0.7)"), hoverlabel=dict(namelength=-1))
    if provenance is not None:
        fig.add_annotation(text=text, xref="paper", yref="paper", x=0, y=0, yshift=-bottom + 8,
                           xanchor="left", yanchor="bottom", showarrow=False, align="left",
                           font=dict(size=_FOOTER_SIZE, color="#666666"), name="provenance")
    return fig


PAPER_WIDTHS_IN: dict[str, float] = {"column": 3.5, "page": 7.0}
"""Figure widths for a paper: one column, and the full width of a two-column page."""
PX_PER_IN = 96  # plotly's and the PDF renderer's CSS pixels per inch
_PAPER_FONT_PT = {"column": 7.0, "page": 8.0}


def for_paper(fig: go.Figure, size: str) -> go.Figure:
    """``fig`` resized to a paper width (``PAPER_WIDTHS_IN``: "column" ~3.5 in, "page" ~7 in) with fonts
    that read at print size (7-8 pt), the aspect ratio and the provenance footer kept; a copy.

    The title is left out (a paper's caption says what a figure shows); the legend goes above the
    plot, the footer is wrapped under it, annotations, markers and colour bars shrink with the fonts."""
    if size not in PAPER_WIDTHS_IN:
        from workbench.errors import ArgumentError

        raise ArgumentError(f"size {size!r}: one of {', '.join(PAPER_WIDTHS_IN)}")
    out = go.Figure(fig)
    width = round(PAPER_WIDTHS_IN[size] * PX_PER_IN)
    old_width, old_height = out.layout.width or 900, out.layout.height or 520
    height = round(width * min(max(old_height / old_width, 0.6), 1.2))
    font = round(_PAPER_FONT_PT[size] * PX_PER_IN / 72, 1)
    small = round(font * 0.8, 1)
    shrink = font / FONT_SIZE
    footer_chars = int(0.55 * width / (0.55 * small))  # the plot area is at least ~55 % of the width
    footers = [a for a in out.layout.annotations if a.name == "provenance"]
    footer_lines = _wrap(str(footers[0].text), footer_chars).count("<br>") + 1 if footers else 0
    entries = [t for t in out.data if t.showlegend is not False and t.name] if out.layout.showlegend is not False \
        else []
    top = round((1.6 * len(entries) + 0.8) * font)  # room for one entry per line, the worst case
    # tick labels, the gap plotly leaves under them and an axis title; a line more for each break in the title
    title_breaks = max((str(axis.title.text).count("<br>") for axis in out.select_xaxes() if axis.title.text),
                       default=0)
    bottom = round((4.6 + 1.3 * title_breaks) * font + footer_lines * 1.3 * small)
    out.update_layout(width=width, height=height + top + bottom, font=dict(size=font), title=None,
                      margin=dict(l=round(4.5 * font), r=round(1.5 * font), t=top, b=bottom),
                      legend=dict(font=dict(size=font), orientation="h", x=0, xanchor="left", y=1.0,
                                  yanchor="bottom"))
    for annotation in out.layout.annotations:
        if annotation.name == "provenance":
            annotation.update(text=_wrap(str(annotation.text), footer_chars), font=dict(size=small),
                              yshift=-bottom + 2)
        else:
            annotation.update(font=dict(size=font))
    for trace in out.data:
        marker = getattr(trace, "marker", None)
        if marker is not None and isinstance(marker.size, int | float):
            marker.size = max(3.0, marker.size * shrink)
        if hasattr(trace, "colorbar"):
            trace.colorbar.update(thickness=max(6, round(font)), title=dict(font=dict(size=font)),
                                  tickfont=dict(size=font))
    return out


def resized(fig: go.Figure, width: int, height: int) -> go.Figure:
    """``fig`` laid out ``width`` x ``height`` pixels, fonts kept, its provenance footer wrapped to the width and
    the bottom margin grown by the lines that adds; a copy. (``for_paper`` also shrinks the fonts to print size.)"""
    out = go.Figure(fig)
    out.update_layout(width=width, height=height)
    for footer in [a for a in out.layout.annotations if a.name == "provenance"]:
        left = out.layout.margin.l if out.layout.margin.l is not None else 80
        lines = str(footer.text).count("<br>")
        footer.text = _wrap(str(footer.text), int((width - left) / (_FOOTER_CHAR_EM * footer.font.size)))
        bottom = (out.layout.margin.b or 0) + round(1.3 * footer.font.size * (footer.text.count("<br>") - lines))
        footer.yshift = -bottom + 8
        out.update_layout(margin=dict(b=bottom))
    return out


_FOOTER_CHAR_EM = 0.62
"""Width of the footer's average character (DejaVu Sans, wider than Arial) in ems."""


def _wrap(text: str, chars: int) -> str:
    """``text`` with ``<br>`` breaks so that no line is longer than ``chars`` (words kept whole)."""
    lines = []
    for line in text.split("<br>"):
        current = ""
        for word in line.split(" "):
            if current and len(current) + 1 + len(word) > chars:
                lines.append(current)
                current = word
            else:
                current = f"{current} {word}" if current else word
        lines.append(current)
    return "<br>".join(lines)


def floor_band(fig: go.Figure, x: list, low: Sequence[float], high: Sequence[float], *,  # type: ignore[type-arg]
               row: int = 1, col: int = 1, name: str = "noise floor", show: bool = True,
               log: bool = False, seeds: bool = False) -> None:
    """The noise floor as a grey band from ``low`` to ``high`` over ``x``; with ``seeds``, the seed-to-seed
    spread as a blue one. Steps where a bound is missing are left out; a band of no width (one run) is drawn
    as a dotted line. On a log axis a band whose top is <= 0 is a gap, and one whose bottom is <= 0 (runs
    that agree bitwise there) reaches a decade below the band's smallest positive value: each stretch
    between gaps is a polygon of its own."""
    lows, highs = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    kept = ~(np.isnan(lows) | np.isnan(highs))  # steps without a band (a validation loss every N steps)
    xs, lows, highs = np.asarray(x, dtype=object)[kept], lows[kept], highs[kept]
    fill = SEED_COLOUR if seeds else FLOOR_COLOUR
    # one run (or runs that agree) gives a band of no width: drawn as its edge, in the band's colour made opaque
    edge = dict(width=2, dash="dot", color=BAND_EDGES[fill]) if np.array_equal(lows, highs) else dict(width=0)
    shown = np.ones(len(xs), dtype=bool)
    if log:
        shown = highs > 0
        positive = np.concatenate([lows[lows > 0], highs[shown]])
        lows = np.where(lows > 0, lows, positive.min() / 10 if positive.size else np.nan)
    # one closed polygon per stretch of shown points, separated by None (plotly fills each on its own)
    breaks = np.flatnonzero(np.diff(shown.astype(int))) + 1
    band_x: list[object] = []
    band_y: list[float | None] = []
    for piece in np.split(np.arange(len(xs)), breaks):
        if len(piece) and shown[piece[0]]:
            band_x += [*xs[piece], *xs[piece][::-1], None]
            band_y += [*lows[piece], *highs[piece][::-1], None]
    fig.add_trace(go.Scatter(x=band_x[:-1], y=band_y[:-1], fill="toself", mode="lines",
                             fillcolor=fill, line=edge, name=name, hoverinfo="skip", showlegend=show,
                             legendgroup="seeds" if seeds else "floor"), row=row, col=col)
