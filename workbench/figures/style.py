"""How every figure looks: a print-friendly template, a colour-blind-safe palette and the provenance footer.

    fig = go.Figure(...)
    apply_style(fig, title="...", provenance=Provenance.of(...))

The palette is Okabe and Ito's colours (their yellow, unreadable on white paper, swapped for
wine), distinguishable with the common colour-vision deficiencies; sequential scales are cividis. Every
exported figure carries a footer naming the runs, their configs, the store's schema
version and the code revision, so a figure cut out of a report still says where it came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

PALETTE: tuple[str, ...] = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#882255")
SEQUENTIAL = "Cividis"
EQUAL_COLOUR = "#e8e8e8"
"""Background of a heatmap where runs are bitwise equal."""
FLOOR_COLOUR = "rgba(120, 120, 120, 0.22)"
FONT = dict(family="DejaVu Sans, Arial, sans-serif", size=13, color="#222222")


@dataclass(frozen=True)
class Provenance:
    runs: tuple[str, ...]
    """Run ids."""
    configs: tuple[str, ...]
    """One-line config summaries, one per distinct config."""
    schema_version: int
    revision: str | None
    """Code revision (git) the runs were made with."""

    def footer(self) -> str:
        revision = (self.revision or "unknown")[:12]
        configs = "; ".join(self.configs[:3]) + (" ..." if len(self.configs) > 3 else "")
        runs = ", ".join(self.runs[:6]) + (f" and {len(self.runs) - 6} more" if len(self.runs) > 6 else "")
        return f"runs: {runs}<br>config: {configs} · store schema v{self.schema_version} · revision {revision}"


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def apply_style(fig: go.Figure, *, title: str, provenance: Provenance | None = None, height: int = 520,
                width: int | None = None) -> go.Figure:
    """Title, fonts, margins, white background and the provenance footer; returns ``fig``."""
    bottom = 95 if provenance is not None else 60
    fig.update_layout(template="plotly_white", font=FONT, title=dict(text=title, x=0.01, xanchor="left"),
                      height=height, width=width, margin=dict(l=70, r=30, t=60, b=bottom), colorway=list(PALETTE),
                      legend=dict(bgcolor="rgba(255,255,255,0.7)"), hoverlabel=dict(namelength=-1))
    if provenance is not None:
        fig.add_annotation(text=provenance.footer(), xref="paper", yref="paper", x=0, y=0, yshift=-bottom + 8,
                           xanchor="left", yanchor="bottom", showarrow=False, align="left",
                           font=dict(size=9, color="#666666"), name="provenance")
    return fig


def floor_band(fig: go.Figure, x: list, low: Sequence[float], high: Sequence[float], *,  # type: ignore[type-arg]
               row: int = 1, col: int = 1, name: str = "noise floor", show: bool = True,
               log: bool = False) -> None:
    """The noise floor as a grey band from ``low`` to ``high`` over ``x`` (on a log axis, values <= 0 are gaps)."""
    lows = np.asarray(low, dtype=float)
    if log:
        lows = np.where(lows > 0, lows, np.nan)
    fig.add_trace(go.Scatter(x=[*x, *x[::-1]], y=[*lows, *np.asarray(high, dtype=float)[::-1]], fill="toself",
                             fillcolor=FLOOR_COLOUR, line=dict(width=0), name=name, hoverinfo="skip",
                             showlegend=show, legendgroup="floor"), row=row, col=col)
