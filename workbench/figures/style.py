"""How every figure looks: a print-friendly template, a colour-blind-safe palette and the provenance footer.

    fig = go.Figure(...)
    apply_style(fig, title="...", provenance=workspace.provenance(names))   # a store.manifest.Provenance

The palette is Okabe and Ito's colours (their yellow, unreadable on white paper, swapped for
wine), distinguishable with the common colour-vision deficiencies; sequential scales are cividis. Every
exported figure carries a footer naming the runs, their configs, the store's schema
version and the code revision, so a figure cut out of a report still says where it came from.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

from workbench.store.manifest import Provenance

PALETTE: tuple[str, ...] = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#882255",
                            "#117733", "#88CCEE", "#AA4499", "#999933", "#332288", "#DDCC77", "#44AA99", "#661100")
"""Okabe and Ito's eight colours, then eight more of Paul Tol's (muted, dark): 16 runs in 16 colours before a
dash tells two apart."""
SEQUENTIAL = "Cividis"
EQUAL_COLOUR = "#e8e8e8"
"""Background of a heatmap where runs are bitwise equal."""
FLOOR_COLOUR = "rgba(120, 120, 120, 0.22)"
SEED_COLOUR = "rgba(86, 180, 233, 0.18)"
"""The seed-to-seed spread's band (the palette's sky blue, lighter than the noise floor's grey)."""
ROUNDING_COLOUR = "rgba(0, 158, 115, 0.20)"
"""The rounding band's (the palette's bluish green): band runs, the rounding a correct change may make."""
BAND_EDGES = {FLOOR_COLOUR: "rgb(120, 120, 120)", SEED_COLOUR: "rgb(86, 180, 233)", ROUNDING_COLOUR: "rgb(0, 158, 115)"}
"""Each band's colour made opaque: the dotted line of a band of no width."""
NOISE_FLOOR = "noise floor (repeats)"
SEED_SPREAD = "seed-to-seed spread"
ROUNDING_BAND = "rounding band (band runs)"
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
"""With ``PALETTE``: the line styles of one figure's runs, len(PALETTE) x len(DASHES) = 64 before one repeats."""


def line_style(index: int) -> dict[str, str]:
    """The colour and dash of the ``index``-th run of a figure: the palette's colours first, solid; then again,
    dashed; and so on, so that no two of a figure's first 64 runs look alike."""
    return dict(color=PALETTE[index % len(PALETTE)], dash=DASHES[index // len(PALETTE) % len(DASHES)])


def log_ticks(*values: Iterable[float]) -> dict[str, float]:
    """A log axis's tick spacing for ``values``: one label a decade (``dtick=1``) when they span at least two
    decades, where plotly's own labels the 2s and 5s between them too ("10⁴ 5 2 10³ 5 2", crowded); else
    nothing, and plotly's choice (inside a decade a decade's labels would leave the axis bare)."""
    finite = [float(v) for group in values for v in group if v is not None and math.isfinite(v) and v > 0]
    if not finite or math.log10(max(finite) / min(finite)) < 2:
        return {}
    return {"dtick": 1}


SHORT_LAYERS = {"embedding": "emb", "final_layernorm": "ln_f", "output_layer": "out"}
"""The short names of the layers that are not ``L<n>``, where a paper's width leaves no room for the long."""


def short_layer(label: str) -> str:
    """A layer's label (``sites.layer_label``), or labels joined by `` · ``, made short: ``emb``, ``L0`` ...,
    ``ln_f``, ``out``."""
    return " · ".join(SHORT_LAYERS.get(part, part) for part in label.split(" · "))


RunStyles = Mapping[str, Mapping[str, str]]
"""A line style (``line_style``) by run name."""


def run_styles(names: Sequence[str]) -> dict[str, dict[str, str]]:
    """Each run's line style by its place among ``names``, every run of a folder in its order: a run keeps its
    colour whichever of them a figure draws, in every figure given the same names."""
    return {name: line_style(i) for i, name in enumerate(dict.fromkeys(names))}


def style_of(styles: RunStyles | None, name: str, index: int) -> dict[str, str]:
    """``name``'s style in ``styles``, else the ``index``-th (a figure drawn without a folder's order)."""
    return dict(styles[name]) if styles is not None and name in styles else line_style(index)


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


def legend_rows(entries: list[str], width: float = 630.0, font_size: float = FONT_SIZE) -> float:
    """Rows of a horizontal legend of ``entries`` across ``width`` pixels (a 700 px figure less its left margin),
    each entry its symbol (~40 px at ``FONT_SIZE``) and its text (~0.62 em a character). An entry of several lines
    (``<br>``) is as wide as its longest, and each line more makes its row ~0.6 of a row higher."""
    rows, used, extra = 0.0, 0.0, 0.0
    for entry in entries:
        lines = entry.split("<br>")
        needed = (40 / FONT_SIZE + 0.62 * max(len(line) for line in lines)) * font_size
        if used and used + needed > width:
            rows, used, extra = rows + 1 + extra, 0.0, 0.0
        used += needed
        extra = max(extra, 0.6 * (len(lines) - 1))
    return rows + 1 + extra


_FOOTER_SIZE = 9
"""Font size (px) of the provenance footer."""


def apply_style(fig: go.Figure, *, title: str, provenance: Provenance | None = None, height: int = 520,
                width: int | None = None, room_below: int = 0) -> go.Figure:
    """Title, fonts, margins, white background and the provenance footer; returns ``fig``. ``room_below``:
    pixels more between the plot and the footer (an x axis title of two lines)."""
    bottom = (95 if provenance is not None else 60) + room_below  # the footer's two lines included
    fig.update_layout(template=TEMPLATE, font=FONT, title=dict(text=title, x=0.01, xanchor="left"),
                      height=height, width=width, margin=dict(l=70, r=30, t=60, b=bottom), colorway=list(PALETTE),
                      legend=dict(bgcolor="rgba(255,255,255,0.7)"), hoverlabel=dict(namelength=-1))
    if provenance is not None:
        fig.add_annotation(text=footer(provenance), xref="paper", yref="paper", x=0, y=0, xanchor="left",
                           yanchor="bottom", showarrow=False, align="left",
                           font=dict(size=_FOOTER_SIZE, color="#666666"), name="provenance")
        fit_footer(fig)
    return fig


def _label_chars(fig: go.Figure, axis: go.layout.XAxis | go.layout.YAxis) -> int:
    """The longest tick label of ``axis`` in characters: its tick texts, or the names (strings) its traces put
    there; 0 for numbers (their labels are short) and for an axis without labels."""
    if axis.showticklabels is False:
        return 0
    if axis.ticktext:
        return max(len(re.sub(r"<[^>]+>", "", str(t))) for t in axis.ticktext)
    letter = axis.plotly_name[0]
    ref = letter + axis.plotly_name.removeprefix(f"{letter}axis")
    values = [v for t in fig.data if (getattr(t, f"{letter}axis", None) or letter) == ref
              and isinstance(getattr(t, letter, None), list | tuple) for v in getattr(t, letter)]
    return max((len(v) for v in values if isinstance(v, str)), default=0)


FIGURE_WIDTH_PX = 700
"""The width of a figure that sets none: plotly's default in a notebook, and kaleido's in an export."""


def fit_footer(fig: go.Figure, *, gap: int = 8) -> go.Figure:
    """The provenance footer at the figure's left edge and bottom, ``gap`` pixels in, wrapped to the figure's
    width; the bottom margin grows by the lines the wrap adds to or takes from its two (``fig`` changed and
    returned). Call it again after a change of the width or of the left margin (the footer is placed relative
    to the plot: plotly's annotations have no figure coordinates)."""
    width = fig.layout.width or FIGURE_WIDTH_PX
    left = fig.layout.margin.l if fig.layout.margin.l is not None else 80
    for note in [a for a in fig.layout.annotations if a.name == "provenance"]:
        size = note.font.size or _FOOTER_SIZE
        before = str(note.text).count("<br>")
        text = _wrap(_unwrap(str(note.text)), int((width - 2 * gap) / (_FOOTER_CHAR_EM * size)))
        bottom = (fig.layout.margin.b or 0) + round(1.3 * size * (text.count("<br>") - before))
        note.update(text=text, x=0, xshift=-left + gap, yshift=-bottom + gap)
        fig.update_layout(margin=dict(b=bottom))
    return fig


def _unwrap(text: str) -> str:
    """A footer as ``footer`` wrote it: the breaks a wrap put between words taken out (its two lines kept)."""
    return re.sub(r"<br>(?!config: )", " ", text)


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
    footers = [a for a in out.layout.annotations if a.name == "provenance"]
    entries = [t for t in out.data if t.showlegend is not False and t.name] if out.layout.showlegend is not False \
        else []
    # the y tick labels' width and the axis title: set, so that plotly need not push the plot (the footer is
    # placed from the left margin)
    for axis in out.select_yaxes():  # layer names short: a heatmap's "final_layernorm · output_layer" took a third
        if axis.ticktext:            # of a column's width
            axis.ticktext = [short_layer(str(text)) for text in axis.ticktext]
    names = max((_label_chars(out, axis) for axis in out.select_yaxes()), default=0)
    left, right = round(max(6.5, 0.6 * names + 2.7) * font), round(1.5 * font)
    # titles over the panels (make_subplots' annotations): wrapped to their panel, the legend above them
    headers = [a for a in out.layout.annotations if a.name != "provenance" and a.yref == "paper"
               and (a.y or 0) >= 0.98 and a.yanchor == "bottom"]
    header_lines = 0
    for header in headers:
        text = _wrap(str(header.text), max(8, int((width - left - right) / len(headers) / (0.6 * font))))
        header.update(text=text)
        header_lines = max(header_lines, text.count("<br>") + 1)
    above = round((0.6 + 1.3 * header_lines) * font)  # between the plot's top and the legend
    rows = legend_rows([str(t.name) for t in entries], 0.9 * (width - left - right), font) if entries else 0
    top = round(rows * (2.2 * font + 8) + 0.4 * font) + above  # plotly's row: the text, its padding and the gap
    # tick labels, the gap plotly leaves under them and an axis title; a line more for each break in the title;
    # slanted category labels take their length's projection; the footer's two lines (fit_footer adds the rest)
    title_breaks = max((str(axis.title.text).count("<br>") for axis in out.select_xaxes() if axis.title.text),
                       default=0)
    slanted = max((_label_chars(out, axis) * 0.6 * abs(math.sin(math.radians(axis.tickangle)))
                   for axis in out.select_xaxes() if axis.tickangle not in (None, 0)), default=0.0)
    lines = sum(str(a.text).count("<br>") + 1 for a in footers)  # as wrapped now; fit_footer adds the difference
    bottom = round((4.8 + 1.5 * title_breaks + max(0.0, slanted - 1)) * font + 1.3 * small * lines)
    out.update_layout(width=width, height=height + top + bottom, font=dict(size=font), title=None,  # height: plot's
                      margin=dict(l=left, r=right, t=top, b=bottom),
                      legend=dict(font=dict(size=font), orientation="h", x=0, xanchor="left",
                                  y=1.0 + above / height, yanchor="bottom"))
    for annotation in out.layout.annotations:
        annotation.update(font=dict(size=small if annotation.name == "provenance" else font))
    fit_footer(out, gap=2)
    for trace in out.data:
        marker = getattr(trace, "marker", None)
        if marker is not None and isinstance(getattr(marker, "size", None), int | float):  # a bar's has none
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
    return fit_footer(out)


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
               log: bool = False, seeds: bool = False, rounding: bool = False) -> None:
    """The noise floor as a grey band from ``low`` to ``high`` over ``x``; with ``seeds``, the seed-to-seed
    spread as a blue one; with ``rounding``, the rounding band (the reference's band runs) as a green one. Steps
    where a bound is missing are left out; a band of no width (one run) is drawn as a dotted line. On a log axis
    a band whose top is <= 0 is a gap, and one whose bottom is <= 0 (runs that agree bitwise there) reaches a
    decade below the band's smallest positive value: each stretch between gaps is a polygon of its own."""
    lows, highs = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    kept = ~(np.isnan(lows) | np.isnan(highs))  # steps without a band (a validation loss every N steps)
    xs, lows, highs = np.asarray(x, dtype=object)[kept], lows[kept], highs[kept]
    fill = ROUNDING_COLOUR if rounding else SEED_COLOUR if seeds else FLOOR_COLOUR
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
                             legendgroup="rounding" if rounding else "seeds" if seeds else "floor"), row=row, col=col)
