"""A stored session as one self-contained HTML file: opens from disk, no server, no network.

The file holds the session's title, model, seed and prompt, a step scrubber shared by the lanes,
then per lane its decoder and knobs, its output with the token colouring the page gives it under
"auto" (``visualizers.tokens``, token text HTML-escaped; a click on a token moves the scrubber to
its step), the colouring's legend, the lane's stats line, the notes on its steps, the plots of
the step under the scrubber (``visualizers.step_figures`` of every step, the first
:data:`MAX_EXPORT_STEPS`) and its whole-run plots (``visualizers.run_figures``); a comparison of
several lanes adds the plots across lanes (``visualizers.COMPARE_PLOTS``). Every figure is embedded as its plotly JSON in a
``<script type="application/json">`` block and drawn by plotly.js, which is inlined once
(``plotly.offline.get_plotlyjs()``, about 5 MB). Nothing refers to a URL, so the file reads the
same offline in any browser; nothing needs a model.

``playground sessions html ID -o file.html`` writes it (``playground/sessions_cli.py``), and so
does the Sessions tab's *Export HTML*.
"""

from __future__ import annotations

import html
import json
from typing import Any

from plotly.offline import get_plotlyjs

import visualizers
from playground.notes import notes_of
from visualizers._common import empty_figure

_CSS = """
:root { color-scheme: light dark; --ink: #1f2328; --muted: #6b7280; --card: rgba(128,128,128,0.07); }
@media (prefers-color-scheme: dark) { :root { --ink: #e6edf3; --muted: #9aa1ab; } }
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink); margin: 24px auto;
       max-width: 1100px; padding: 0 16px; line-height: 1.45; }
h1 { font-size: 1.5em; margin-bottom: 4px; } h2 { font-size: 1.15em; margin: 0 0 6px; }
.meta, .knobs, .lane-stats { color: var(--muted); font-size: 0.9em; }
.notes { font-size: 0.9em; margin: 6px 0; } .notes ul { margin: 2px 0 0 1.2em; padding: 0; }
.prompt { white-space: pre-wrap; background: var(--card); padding: 10px 12px; border-radius: 6px; }
.lane { background: var(--card); border-radius: 8px; padding: 14px 16px; margin: 18px 0; }
.tok-output { margin: 10px 0 6px; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr)); gap: 10px; margin-top: 10px; }
.plot { min-height: 450px; }
.note { color: var(--muted); font-size: 0.85em; }
.scrub { position: sticky; top: 0; z-index: 5; background: Canvas; padding: 8px 0; display: flex; gap: 12px;
         align-items: center; } .scrub input { flex: 1; }
.step-plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr)); gap: 10px; }
.tok.pg-current { outline: 2px solid #6366f1; border-radius: 3px; }
"""

# Draws every embedded figure; the figures' JSON sits in script blocks, so no markup is built
# from it. The step scrubber redraws each lane's step plots from its block of steps (an HTML plot
# is the page's own escaped markup) and marks the tokens that step committed.
_DRAW = """
var PG_CONFIG = {displaylogo: false, responsive: true};
document.querySelectorAll('script[type="application/json"][data-figure]').forEach(function (el) {
  var fig = JSON.parse(el.textContent);
  var div = document.getElementById(el.getAttribute('data-figure'));
  Plotly.newPlot(div, fig.data || [], fig.layout || {}, PG_CONFIG);
});
document.querySelectorAll('article.pg-session').forEach(function (art) {
  var pre = art.getAttribute('data-prefix');
  var scrub = document.getElementById(pre + 'pg-step');
  if (!scrub) return;
  var lanes = [];
  art.querySelectorAll('script[type="application/json"][data-steps]').forEach(function (el) {
    lanes.push({lane: el.getAttribute('data-steps'), steps: JSON.parse(el.textContent)});
  });
  function show(step) {
    document.getElementById(pre + 'pg-step-label').textContent = 'step ' + step;
    lanes.forEach(function (l) {
      var box = document.getElementById(pre + 'pg-lane' + l.lane + '-step');
      var s = Math.min(step, l.steps.length - 1);
      box.replaceChildren();
      var head = document.createElement('div'); head.className = 'note';
      head.textContent = 'step ' + s + (s < step ? ' (its last)' : '');
      box.appendChild(head);
      var grid = document.createElement('div'); grid.className = 'step-plots'; box.appendChild(grid);
      (l.steps[s] || []).forEach(function (p) {
        var div = document.createElement('div'); grid.appendChild(div);
        if (p.html !== undefined) { div.innerHTML = p.html; return; }
        div.className = 'plot'; div.title = p.title;
        Plotly.newPlot(div, p.fig.data || [], p.fig.layout || {}, PG_CONFIG);
      });
      var lane = art.querySelector('section.lane[data-lane="' + l.lane + '"]');
      lane.querySelectorAll('.tok.pg-current').forEach(function (t) { t.classList.remove('pg-current'); });
      lane.querySelectorAll('.tok[data-step="' + s + '"]').forEach(function (t) { t.classList.add('pg-current'); });
    });
  }
  scrub.addEventListener('input', function () { show(parseInt(scrub.value, 10)); });
  art.querySelectorAll('.tok[data-step]').forEach(function (t) {
    t.addEventListener('click', function () { scrub.value = t.getAttribute('data-step'); show(parseInt(scrub.value, 10)); });
  });
  show(parseInt(scrub.value, 10));
});
"""
MAX_EXPORT_STEPS = 200  # steps per lane whose plots the file carries (the scrubber's range)


def _escaped_json(value: Any) -> str:
    """``value`` as JSON (a string is taken as JSON already) with ``<``, ``>`` and ``&`` escaped,
    so no text inside can end the script block that holds it."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _json_block(value: Any, div_id: str) -> str:
    """``value``'s JSON as a script data block naming the div it draws into."""
    return f'<script type="application/json" data-figure="{html.escape(div_id)}">{_escaped_json(value)}</script>'


def _figure(fig: Any, div_id: str, title: str) -> str:
    """One plot: its div, and its figure JSON beside it."""
    try:
        body = fig.to_json()
    except Exception as e:  # noqa: BLE001 - one odd figure must not lose the rest of the export
        body = empty_figure(f"could not serialise this plot: {type(e).__name__}", title).to_json()
    return (f'<div class="plot" id="{html.escape(div_id)}" title="{html.escape(title)}"></div>'
            + _json_block(body, div_id))


def _knobs(trace: dict[str, Any]) -> str:
    params = trace.get("params") if isinstance(trace.get("params"), dict) else {}
    text = ", ".join(f"{k}={v}" for k, v in params.items()) or "default knobs"
    draft = trace.get("draft")
    return text + (f" · draft {draft}" if draft else "")


def _across(name: str, fn: Any, runs: list[dict[str, Any]]) -> Any:
    """A plot across lanes; a bug on odd traces becomes a note, not a lost export."""
    try:
        return fn(runs)
    except Exception as e:  # noqa: BLE001 - as the page's inspector does
        return empty_figure(f"could not draw this plot: {type(e).__name__}", name)


def notes_list(notes: list[dict[str, Any]]) -> str:
    """A lane's notes on its steps (:mod:`playground.notes`), escaped; empty without any."""
    if not notes:
        return ""
    items = "".join(f'<li data-step="{int(n["step"])}"><b>step {int(n["step"])}</b>: {html.escape(n["text"])}</li>'
                    for n in notes)
    return f'<div class="notes"><b>Notes</b><ul>{items}</ul></div>'


def _step_plot(title: str, plot: Any) -> dict[str, Any]:
    """One step plot as the scrubber draws it: a figure's JSON, or a plot's own HTML."""
    if isinstance(plot, str):
        return {"title": title, "html": plot}
    try:
        return {"title": title, "fig": json.loads(plot.to_json())}
    except Exception as e:  # noqa: BLE001 - one odd figure must not lose the rest of the export
        return {"title": title, "fig": json.loads(empty_figure(f"could not serialise this plot: {type(e).__name__}",
                                                              title).to_json())}


def steps_block(trace: dict[str, Any], lane: int) -> str:
    """Every step's plots of a lane (the first :data:`MAX_EXPORT_STEPS`) as one data block."""
    n = min(visualizers.step_count(trace), MAX_EXPORT_STEPS)
    steps = [[_step_plot(t, p) for t, p in visualizers.step_figures(trace, i)] for i in range(n)]
    return f'<script type="application/json" data-steps="{int(lane)}">{_escaped_json(steps)}</script>'


def lane_html(trace: dict[str, Any], lane: int, notes: list[dict[str, Any]] | None = None, prefix: str = "") -> str:
    """One lane's card: decoder and knobs, coloured output, legend, stats line, the notes on its
    steps, run plots; element ids start with ``prefix`` (one per session of a page)."""
    metric = visualizers.auto_metric(trace)
    plots = "".join(_figure(fig, f"{prefix}pg-lane{lane}-plot{k}", title)
                    for k, (title, fig) in enumerate(visualizers.run_figures(trace)))
    return (f'<section class="lane" data-lane="{lane}">'
            f'<h2>Lane {lane + 1}: {html.escape(str(trace.get("decoder", "?")))}</h2>'
            f'<div class="knobs">{html.escape(_knobs(trace))}</div>'
            f'{visualizers.tokens_html(trace, metric, lane=lane)}'
            f'{visualizers.legend_html(metric)}'
            f'<div class="lane-stats">{visualizers.stats_line(trace) or "—"}</div>'
            f'{notes_list(notes or [])}'
            f'<h3>The step under the scrubber</h3><div id="{prefix}pg-lane{lane}-step"></div>'
            f'{steps_block(trace, lane) if visualizers.step_count(trace) else ""}'
            f'<h3>The whole run</h3><div class="plots">{plots}</div></section>')


def session_article(session: dict[str, Any], prefix: str = "", heading: str = "h1") -> str:
    """One session's part of a page: title, meta, prompt, the step scrubber, every lane and the
    plots across lanes, its element ids starting with ``prefix``."""
    runs = [r for r in session.get("runs") or [] if isinstance(r, dict)]
    settings = session.get("settings") if isinstance(session.get("settings"), dict) else {}
    title = str(session.get("title") or "Decoder Playground session")
    meta = [f"session {session.get('id', '?')}", f"model {session.get('model', '?')}"]
    for key, name in (("seed", "seed"), ("max_new_tokens", "max new tokens"), ("policy", "race")):
        if settings.get(key) is not None:
            meta.append(f"{name} {settings[key]}")
    if session.get("created"):
        meta.append(str(session["created"])[:19].replace("T", " "))
    branch = session.get("branch")
    if isinstance(branch, dict):
        meta.append(f"branch of {session.get('parent') or 'a deleted session'}, lane {int(branch.get('lane', 0)) + 1}, "
                    f"step {branch.get('step', '?')}")
    across = ""
    if len(runs) > 1:
        across = '<section class="lane"><h2>Across lanes</h2><div class="plots">' + "".join(
            _figure(_across(name, fn, runs), f"{prefix}pg-compare{k}", name)
            for k, (name, fn) in enumerate(visualizers.COMPARE_PLOTS)) + "</div></section>"
    notes = notes_of(session)
    top = min(max((visualizers.step_count(t) for t in runs), default=0), MAX_EXPORT_STEPS)
    scrub = ("" if top == 0 else
             f'<div class="scrub"><label for="{prefix}pg-step">Step (all lanes; click a token to jump)</label>'
             f'<input type="range" id="{prefix}pg-step" min="0" max="{top - 1}" value="{top - 1}" step="1">'
             f'<span id="{prefix}pg-step-label"></span></div>')
    lanes = "".join(lane_html(t, j, [n for n in notes if n["lane"] == j], prefix) for j, t in enumerate(runs))
    body = (scrub + lanes) if lanes else '<p class="note">This session has no lanes.</p>'
    return (f'<article class="pg-session" id="{prefix}session" data-prefix="{html.escape(prefix)}">'
            f"<{heading}>{html.escape(title)}</{heading}><div class=\"meta\">{html.escape(' · '.join(meta))}</div>"
            f"<h2 style=\"margin-top:16px\">Prompt</h2><div class=\"prompt\">{html.escape(str(session.get('prompt') or ''))}</div>"
            f"{body}{across}</article>")


def _page(title: str, body: str) -> str:
    """The page around ``body``: plotly.js and the drawing script inlined, nothing fetched."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
            f"<script>{get_plotlyjs()}</script></head><body>{body}"
            "<p class=\"note\">Exported from Decoder Playground; hover a token for its probability and step.</p>"
            f"<script>{_DRAW}</script></body></html>\n")


def session_html(session: dict[str, Any]) -> str:
    """A loaded session (``Store.load_session``) as one self-contained HTML page."""
    return _page(str(session.get("title") or "Decoder Playground session"), session_article(session))


def sessions_html(sessions: list[dict[str, Any]], title: str) -> str:
    """Several loaded sessions (a branch tree, a study's prompts) as one self-contained page:
    a contents list, then each session as :func:`session_article` does, each with its own
    scrubber."""
    if not sessions:
        return _page(title, f"<h1>{html.escape(title)}</h1><p class=\"note\">No sessions.</p>")
    items = "".join(f'<li><a href="#s{k}-session">{html.escape(str(s.get("title") or s.get("id")))}</a></li>'
                    for k, s in enumerate(sessions))
    head = (f"<h1>{html.escape(title)}</h1><div class=\"meta\">{len(sessions)} sessions</div>"
            f'<nav class="contents"><ol>{items}</ol></nav>')
    return _page(title, head + "".join(session_article(s, f"s{k}-", "h1") for k, s in enumerate(sessions)))
