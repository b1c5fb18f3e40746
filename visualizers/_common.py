"""Shared pieces of the visualizers: colours, the figure look, token text, step lookup.

Everything here is tolerant of partial traces: a live snapshot may have no steps yet, an
older or newer decoder may leave an optional evidence field out, and a stored trace may
come from a version that wrote ``null`` where a number is expected. Helpers return
``None``/empty values instead of raising, and the figure builders turn those into a
figure with a note.
"""

from __future__ import annotations

import html
import math
from typing import Any, Iterable

import plotly.graph_objects as go
import plotly.io as pio

# The token colourings ``tokens.tokens_html`` draws (plots declare the one that suits their lanes).
METRICS = ("probability", "entropy", "acceptance", "unmask_step", "watermark", "none")

# One palette for every plot and for the coloured output, so a colour means the same
# thing everywhere (accepted draft token = green, in the tree, the histogram and the text).
ACCEPTED = "#22a55b"
REJECTED = "#e5484d"
UNREACHED = "#9aa1ab"
CORRECTION = "#f07a1a"
BONUS = "#3b82f6"
RAW = "#94a3b8"
FINAL = "#6366f1"
CHOSEN = "#f5a524"
ENTROPY = "#8b5cf6"
MASK = "#9aa1ab"
LANE_COLOURS = ["#6366f1", "#f07a1a", "#22a55b", "#e5484d", "#0ea5e9", "#d946ef"]

# Neutral ink: readable on both a light and a dark page, since the figures sit on the
# page background (transparent paper) whatever Gradio theme the user runs.
INK = "#7d8590"
GRID = "rgba(128,128,128,0.22)"
HEIGHT = 450


TEMPLATE = "playground"
# Lane cards are about 400 px wide: a title line at 14 px holds ~46 characters, a subtitle
# line at 11 px ~62. Plotly never wraps text, so base_layout wraps at these widths.
TITLE_CHARS = 46
SUBTITLE_CHARS = 62
# The legend sits below the plot, anchored to the bottom of the figure: a legend above the
# plot shares the title's row and covers it as soon as the title is long. Anchoring to the
# container (not the plot area) makes plotly reserve that strip, so the x-axis title and
# tick labels are pushed up instead of being drawn under the legend.
LEGEND = {"orientation": "h", "yref": "container", "y": 0.0, "yanchor": "bottom",
          "xanchor": "left", "x": 0.0, "bgcolor": "rgba(0,0,0,0)"}
# The title hangs from the top of the figure and base_layout sizes the top margin to its
# lines (plotly's title automargin leaves a second subtitle line over the plot).
TITLE = {"x": 0.0, "xref": "paper", "xanchor": "left", "yref": "container", "y": 1.0, "yanchor": "top",
         "pad": {"t": 10}, "font": {"size": 14}}
# px, measured on rendered figures: the title line, the first subtitle line (plotly leaves a
# gap above it), each further subtitle line, and the space kept above the plot area.
TITLE_LINE, SUBTITLE_FIRST, SUBTITLE_LINE, TITLE_GAP = 22, 26, 15, 14
# The shared look as a registered plotly template: assigning a template by name is several
# times cheaper than validating the same layout keys on every figure, and the inspector
# redraws a few figures per lane on every scrubber move.
pio.templates[TEMPLATE] = go.layout.Template(layout={
    "height": HEIGHT,
    "margin": {"l": 52, "r": 20, "t": 10 + TITLE_LINE + TITLE_GAP, "b": 20},
    "paper_bgcolor": "rgba(0,0,0,0)",
    "plot_bgcolor": "rgba(128,128,128,0.05)",
    "font": {"color": INK, "size": 12},
    "title": TITLE,
    "legend": LEGEND,
    "hoverlabel": {"font": {"size": 12}},
    "bargap": 0.18,
    "colorway": LANE_COLOURS,
    "xaxis": {"gridcolor": GRID, "zerolinecolor": GRID, "linecolor": GRID, "automargin": True},
    "yaxis": {"gridcolor": GRID, "zerolinecolor": GRID, "linecolor": GRID, "automargin": True},
})


def wrap_parts(parts: Iterable[str], width: int, sep: str = " · ") -> list[str]:
    """Pack ``parts`` into lines of at most ``width`` characters, joined by ``sep`` within a
    line; a part longer than a line is broken after a comma or at a space."""
    lines: list[str] = []
    for p in (p for p in parts if p):
        while len(p) > width:
            comma = p.rfind(", ", 0, width)
            cut = comma + 1 if comma > 0 else p.rfind(" ", 0, width)
            if cut <= 0:
                break
            lines.append(p[:cut].rstrip())
            p = p[cut:].lstrip()
        if lines and len(lines[-1]) + len(sep) + len(p) <= width:
            lines[-1] += sep + p
        else:
            lines.append(p)
    return lines


def split_title(title: str, subtitle: str = "") -> tuple[str, list[str]]:
    """(title line, subtitle lines): the title's first " · " part, then as many further parts
    as fit its line; the rest move to the subtitle, ahead of ``subtitle``'s own parts, in
    lines that fit a lane card. The first part is never broken (keep it short)."""
    parts = [p for p in title.split(" · ") if p]
    first, k = (parts[0] if parts else ""), 1
    while k < len(parts) and len(first) + 3 + len(parts[k]) <= TITLE_CHARS:
        first, k = first + " · " + parts[k], k + 1
    return first, wrap_parts(parts[k:] + (subtitle.split(" · ") if subtitle else []), SUBTITLE_CHARS)


# A gr.Plot that shows its label draws it over the figure's top-left corner (and raises the
# top margin to at least 100 px): a figure shown that way starts its title below the label.
LABEL_CLEARANCE = 40


def top_margin(subtitle_lines: int, pad: int = int(TITLE["pad"]["t"])) -> int:
    """Top margin (px) that holds the title (``pad`` px from the top) and ``subtitle_lines``
    subtitle lines."""
    sub = SUBTITLE_FIRST + SUBTITLE_LINE * (subtitle_lines - 1) if subtitle_lines > 0 else 0
    return pad + TITLE_LINE + sub + TITLE_GAP


def base_layout(fig: go.Figure, title: str, height: int = HEIGHT, subtitle: str = "",
                under_label: bool = False, **more: Any) -> go.Figure:
    """Apply the shared look (template ``playground``: transparent background, neutral ink,
    legend below the plot, title above it) and a title. ``title``/``subtitle`` must already
    be escaped (:func:`plot_text`); their " · "-separated parts are wrapped to the width of
    a lane card, so nothing is cut off at the right edge. ``under_label``: the page shows
    the figure under a block label, so the title starts below it."""
    head, sub = split_title(title, subtitle)
    lay: dict[str, Any] = {"template": TEMPLATE, "title": {"text": head}}
    pad = LABEL_CLEARANCE if under_label else int(TITLE["pad"]["t"])
    if under_label:
        lay["title"]["pad"] = {"t": pad}
    if sub:
        lay["title"]["subtitle"] = {"text": "<br>".join(sub), "font": {"size": 11, "color": INK}}
    if sub or under_label:
        lay["margin"] = {"t": top_margin(len(sub), pad)}
    if height != HEIGHT:
        lay["height"] = height
    if isinstance(more.get("margin"), dict):
        lay["margin"] = {**lay.get("margin", {}), **more.pop("margin")}
    lay.update(more)
    fig.update_layout(lay)
    return fig


def empty_figure(note: str, title: str = "") -> go.Figure:
    """A blank figure that says why it is blank (no steps yet, wrong step kind, ...)."""
    return go.Figure(layout={
        "template": TEMPLATE, "title": {"text": plot_text(title)},
        "xaxis": {"visible": False}, "yaxis": {"visible": False},
        "annotations": [{"text": plot_text(note), "x": 0.5, "y": 0.5, "xref": "paper", "yref": "paper",
                         "showarrow": False, "font": {"size": 14, "color": INK}}],
    })


# ---------------------------------------------------------------------- token text
def token_text(trace: dict[str, Any], token_id: Any) -> str:
    """Display text of a token id from the trace's own ``tokens`` map ("#id" if absent)."""
    if token_id is None:
        return ""
    tokens = trace.get("tokens") if isinstance(trace, dict) else None
    if isinstance(tokens, dict):
        s = tokens.get(str(token_id))
        if s is None:
            s = tokens.get(token_id)  # a dict built in Python may key by int
        if isinstance(s, str):
            return s
    return f"#{token_id}"


def visible(s: str) -> str:
    """Make whitespace visible in a short label: newline, tab, and edge spaces."""
    s = s.replace("\r", "").replace("\n", "↵").replace("\t", "→")
    if s.startswith(" "):
        s = "␣" + s[1:]
    if s.endswith(" ") and len(s) > 1:
        s = s[:-1] + "␣"
    return s or "∅"


def plot_text(s: Any) -> str:
    """Text that plotly may render as HTML: escape ``&``, ``<``, ``>``.

    Quotes stay as they are: plotly decodes only a few named entities, so ``&quot;``
    would show literally, and quotes are harmless in its text nodes.
    """
    return html.escape(str(s), quote=False)


NEWLINE_MARK = '<span class="nl" style="opacity:0.45">↵</span>\n'


def html_token(s: str) -> str:
    """A token's text for HTML: escaped, with each newline shown as a faint ↵ before the
    break, so a newline token has something to colour and to click."""
    return html.escape(s.replace("\r", "")).replace("\n", NEWLINE_MARK)


def label(trace: dict[str, Any], token_id: Any, limit: int = 14) -> str:
    """A short, escaped, whitespace-visible label of a token for a plot."""
    s = visible(token_text(trace, token_id))
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return plot_text(s)


# ---------------------------------------------------------------------- steps
def steps_of(trace: Any) -> list[dict[str, Any]]:
    """The trace's steps (an empty list for anything that is not a trace with steps)."""
    if not isinstance(trace, dict):
        return []
    steps = trace.get("steps")
    return [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []


def pick_step(trace: Any, step: Any) -> tuple[int, dict[str, Any] | None]:
    """The step at index ``step`` (clamped into range; ``None`` means the last)."""
    steps = steps_of(trace)
    if not steps:
        return -1, None
    try:
        i = len(steps) - 1 if step is None else int(step)
    except (TypeError, ValueError):
        i = len(steps) - 1
    i = max(0, min(i, len(steps) - 1))
    return i, steps[i]


def num(x: Any) -> float | None:
    """A finite float, or None for null / NaN / anything that is not a number."""
    if isinstance(x, bool) or x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def ints(xs: Any) -> list[int]:
    """The integers of a list (others dropped); an empty list for a non-list."""
    if not isinstance(xs, (list, tuple)):
        return []
    out = []
    for x in xs:
        if isinstance(x, bool):
            continue
        if isinstance(x, int):
            out.append(x)
        elif isinstance(x, float) and x.is_integer():
            out.append(int(x))
    return out


def at(xs: Any, j: int) -> Any:
    """``xs[j]`` when ``xs`` is a list long enough, else None."""
    if isinstance(xs, (list, tuple)) and 0 <= j < len(xs):
        return xs[j]
    return None


def fmt(x: Any, digits: int = 3) -> str:
    """A number for hover text ("–" when missing)."""
    v = num(x)
    if v is None:
        return "–"
    return f"{v:.{digits}f}"


def kinds_in(trace: Any) -> list[str]:
    """Step kinds present in a trace, in order of first appearance."""
    seen: list[str] = []
    for s in steps_of(trace):
        k = s.get("kind")
        if isinstance(k, str) and k not in seen:
            seen.append(k)
    return seen


def wrong_kind(i: int, step: dict[str, Any], want: str, title: str) -> go.Figure:
    """The note figure for a step whose kind has no such plot."""
    return empty_figure(f"step {i} is a {step.get('kind', '?')} step; this plot is for {want} steps", title)


def int_dtick(top: Any, most: int = 8) -> int | None:
    """A whole-number tick step for an axis of counts up to ``top`` (None: let plotly pick)."""
    t = num(top)
    if t is None or t <= 0:
        return 1
    return max(1, math.ceil(t / most)) if t <= most * 50 else None


def join(parts: Iterable[str], sep: str = " · ") -> str:
    """Join non-empty parts."""
    return sep.join(p for p in parts if p)
