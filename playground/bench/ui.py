"""Suite ``ui``: the Compare page in headless Chromium against the decoders it shows.

The app runs on a free 127.0.0.1 port (its own temporary database, one torch thread) with the
bundled models, and is warmed up by one run before anything is timed. Measured, in-page with
``performance.now()`` and MutationObservers, so Playwright's round trips are not counted:

- Run → Done of the *Speculative showdown* preset, next to the same preset decoded in this
  process the way ``playground compare`` does it (same lanes, seed and lengths, one thread,
  models warm), alternating page and CLI, and their ratio per pair; the page's own
  "Done in X s" figure; the time from Run to the first token shown;
- text updates per second of every lane with 2 and 6 lanes × 128 tokens (*Truncation
  samplers*, cut to 2 lanes with − Lane): changes of the lane's token text between its first
  and last update;
- Stop → idle: from the click on Stop to the status saying "Stopped" with Run enabled again
  (a Stop whose run went on to "Done" is counted as not taken, not timed);
- replay of a shared session (``/?session=<id>``): from navigation start to every visible plot
  drawn.

Every measured Run starts from a settled page (the previous run's plots drawn, the main thread
idle); one more 6-lane run is pressed right after the previous Done, to show what drawing the
last run's plots costs the next one. The first run after start-up (models loading) is reported
too. Recorded, never asserted: browser, app and this process share the machine's cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from playground.bench._browser import VIEW
from playground.core.errors import PlaygroundError

DESCRIPTION = ("Compare page in headless Chromium: showdown Run→Done vs `playground compare`, first token, "
               "updates per second per lane, Stop→idle, shared-session replay")
SHOWDOWN = "speculative-showdown"
STREAM_PRESET = "Truncation samplers"
TARGETS = {"ratio": 2.0, "first": 0.5, "stop": 0.5, "rate": 8.0, "replay": 1.0, "readable": 1.5,
           "first35": 0.4, "replay35": 4.0}

# Click Run and record, per visible lane, every change of its token text; and the moment the
# page is idle again after having been busy. Resolves at once with t0; read window.__ui later.
# One observer on the whole body, re-querying the elements at every callback: Gradio may
# replace a component's node on an update, and an observer on the old node would hear nothing.
RUN_JS = """
(lanes) => {
  const t0 = performance.now();
  const ui = {t0, first: null, done: null, busy: false, lanes: {}};
  if (window.__uiObs) window.__uiObs.disconnect();
  window.__ui = ui;
  const text = (k) => { const out = document.querySelector('#lane-' + k + '-output');
    if (!out) return ['', false];
    const o = out.querySelector('.tok-output');
    return [o ? o.textContent : out.textContent, !!out.querySelector('.tok')]; };
  for (const k of lanes) ui.lanes[k] = {updates: 0, first: null, last: null, prev: text(k)[0]};
  const check = () => {
    const now = performance.now();
    for (const k of lanes) {
      const rec = ui.lanes[k];
      const [t, hasTok] = text(k);
      if (t === rec.prev) continue;  // count new text, not highlights or re-renders of the same tokens
      rec.prev = t; rec.updates += 1; rec.last = now;
      if (hasTok) {
        if (rec.first === null) rec.first = now;
        if (ui.first === null) ui.first = now;
      }
    }
    const status = document.querySelector('#status'), run = document.querySelector('#run');
    if (!status || !run) return;
    const s = status.textContent.trim();
    const idle = !run.disabled && /^(Done|Stopped)/.test(s);
    if (!idle) ui.busy = true;
    else if (ui.busy && ui.done === null) { ui.done = now; ui.status = s; }
    if (status.querySelector('.pg-status-error')) { ui.error = s; if (ui.done === null) ui.done = now; }
  };
  const obs = new MutationObserver(check);
  obs.observe(document.body, {childList: true, subtree: true, characterData: true, attributes: true,
                              attributeFilter: ['disabled']});
  window.__uiObs = obs;
  // the browser keeps 250 resource timings at most, and the live polls fill them: PROFILE_JS
  // looks for this run's request among them
  performance.clearResourceTimings();
  document.querySelector('#run').click();
  check();
  return t0;
}
"""

READ_JS = """
() => { const ui = window.__ui; if (window.__uiObs) window.__uiObs.disconnect();
  const lanes = {};
  for (const [k, r] of Object.entries(ui.lanes))
    lanes[k] = {updates: r.updates, first: r.first, last: r.last,
                tokens: document.querySelectorAll('#lane-' + k + '-output .tok').length};
  return {t0: ui.t0, first: ui.first, done: ui.done, status: ui.status || null, error: ui.error || null, lanes}; }
"""

# Where the last run's first token waited: the page script's marks and the server's (sent with
# the first answer that showed a lane, see playground/ui/live_feed.py), the Run request as the
# browser's resource timing saw it, all on the page's clock (ms, performance.now()).
PROFILE_JS = """
() => { const ui = window.__ui, live = window.__pgLive;
  if (!ui || !live || !live.server) return null;
  const join = performance.getEntriesByType('resource').filter(
    e => /\\/queue\\/join/.test(e.name) && e.startTime >= ui.t0).map(e => e.startTime);
  const server = {};
  const origin = live.server.event_ms - performance.timeOrigin;  // the Run event on the page's clock
  for (const [k, v] of Object.entries(live.server)) if (k !== 'event_ms') server[k] = origin + v;
  // the poll that brought the first lane: the last one answered before the script read it
  const polls = performance.getEntriesByType('resource').filter(
    e => /\\/playground_api\\/live/.test(e.name) && e.startTime >= ui.t0 && e.responseEnd <= (live.t.answer || 0));
  const p = polls.length ? polls[polls.length - 1] : null;
  return {click: ui.t0, shown: ui.first, join: join.length ? Math.min(...join) : null, page: live.t, server,
          poll: p ? {sent: p.startTime, first_byte: p.responseStart, end: p.responseEnd} : {}}; }
"""

# The parts of Run → first token shown, in the order the run goes through them: (name, what it is,
# the mark it starts at, the mark it ends at); a mark is "page.<name>", "server.<name>" or one of
# PROFILE_JS's own (click, join, shown). A part whose marks are missing is not measured.
FIRST_PARTS = [
    ("client event", "click → the Run event's page script runs (Gradio's frontend)", "click", "page.flow"),
    ("request out", "→ the Run request leaves the browser", "page.flow", "join"),
    ("queue", "→ the Run handler is entered on the server (request, queue, inputs read)", "join", "server.event"),
    ("run opened", "→ the first frame handed to Gradio (inputs checked, feed opened)", "server.event",
     "server.first_frame"),
    ("first frame", "→ Gradio sent the first frame and resumed the handler", "server.first_frame",
     "server.resumed"),
    ("runner", "→ the lanes' worker started", "server.resumed", "server.started"),
    ("lane preparation", "→ the first lane prepared (models from the cache, prompt encoded)", "server.started",
     "server.lane_prepared"),
    ("first step", "→ its first decoder step done", "server.lane_prepared", "server.first_step"),
    ("publish", "→ the worker published the lanes", "server.first_step", "server.published"),
    ("poll wakes", "→ the waiting poll has a lane to show", "server.published", "server.ready"),
    ("render", "→ the answer rendered", "server.ready", "server.answered"),
    ("answer out", "→ its first byte reached the browser (the server's event loop, the network)",
     "server.answered", "poll.first_byte"),
    ("answer read", "→ the answer read by the page script (the browser's main thread)", "poll.first_byte",
     "page.answer"),
    ("drawn", "→ the lane text patched in and seen", "page.answer", "shown"),
]


def first_token_parts(profile: dict[str, Any] | None) -> dict[str, float]:
    """The parts of one run's Run → first token (seconds, by :data:`FIRST_PARTS` name) from
    PROFILE_JS's marks; ``total`` is click → shown, ``first poll`` click → the first poll sent."""
    if not profile:
        return {}

    def at(name: str) -> float | None:
        where, _, key = name.partition(".")
        v = (profile.get(where) or {}).get(key) if key else profile.get(name)
        return float(v) if isinstance(v, (int, float)) else None

    out = {}
    for name, _what, a, b in FIRST_PARTS + [("total", "", "click", "shown"), ("first poll", "", "click", "page.poll")]:
        x, y = at(a), at(b)
        if x is not None and y is not None:
            out[name] = (y - x) / 1000.0
    return out


# Click Stop and resolve with the time until the page is idle again (or null after 120 s).
STOP_JS = """
() => new Promise((resolve) => {
  const t0 = performance.now();
  const idle = () => { const s = document.querySelector('#status'), run = document.querySelector('#run');
    return s && run && !run.disabled && /^(Done|Stopped)/.test(s.textContent.trim()); };
  const finish = (ok) => { obs.disconnect(); clearTimeout(timer);
    resolve({s: ok ? (performance.now() - t0) / 1000 : null,
             status: (document.querySelector('#status') || {textContent: ''}).textContent.trim()}); };
  const obs = new MutationObserver(() => { if (idle()) finish(true); });
  obs.observe(document.body, {childList: true, subtree: true, characterData: true, attributes: true,
                              attributeFilter: ['disabled']});
  const timer = setTimeout(() => finish(false), 120000);
  document.querySelector('#stop').click();
})
"""

# Every visible plot of the page (progress strip, each lane's inspector plots) holds a drawn
# figure and the status says the session is replaying: resolve with the time since navigation.
REPLAY_JS = """
(lanes) => new Promise((resolve) => {
  const deadline = performance.now() + 120000;
  let shown = null;  // when the status first said "Replaying": the page has loaded and opened the session
  let seen = null;  // when every plot then in the viewport held a drawn figure (plots are drawn on sight)
  const plots = () => [...document.querySelectorAll('[id]')].filter(
    e => /^(progress-plot|inspect-\\d+-(step|run)-\\d+)$/.test(e.id) && e.getClientRects().length > 0);
  const inView = (e) => { const r = e.getBoundingClientRect(); return r.bottom > 0 && r.top < innerHeight; };
  const tick = () => {
    const s = document.querySelector('#status');
    const ps = plots();
    const isDrawn = (e) => !!e.querySelector('.main-svg');
    const drawn = ps.filter(isDrawn).length;
    const replaying = !!s && /Replaying/.test(s.textContent);
    if (replaying && shown === null) shown = performance.now();
    if (replaying && seen === null && ps.length >= lanes + 1 && ps.filter(inView).every(isDrawn))
      seen = performance.now();
    const ok = replaying && ps.length >= lanes + 1 && drawn === ps.length;
    if (ok || performance.now() > deadline) {
      // readable: the quick read (in the first HTML) parsed and painted; without one, "Replaying"
      const fcp = (performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime;
      const qr = window.pgQuickReadShown;
      const readable = qr === undefined ? shown : Math.max(qr, fcp === undefined ? qr : fcp);
      resolve({s: performance.now() / 1000, shown_s: shown === null ? null : shown / 1000,
               view_s: seen === null ? null : seen / 1000, in_view: ps.filter(inView).length,
               readable_s: readable === null ? null : readable / 1000, quick: qr !== undefined,
               plots: ps.length, drawn, complete: !!ok});
    }
    else setTimeout(tick, 10);
  };
  tick();
})
"""


# Resolve once the page has settled after the previous run: its plots drawn (the plots of a
# run are drawn after its Done), then an idle moment of the main thread. Runs are
# measured from a settled page, as a person presses Run after looking at the last results;
# pressing Run while the last run's plots are still being drawn delays the new run's text by
# as long as the drawing takes (recorded separately: "back to back").
SETTLE_JS = """
() => new Promise((resolve) => {
  const t0 = performance.now();
  // plots with a figure; a plot slot with nothing to draw (a fresh page) never gets one, so
  // "settled" is: this count unchanged for two seconds (the last run's plots come in one
  // event after its Done, built in about a second), then an idle moment
  const count = () => [...document.querySelectorAll('[id]')].filter(
    e => /^(progress-plot|inspect-\\d+-(step|run)-\\d+)$/.test(e.id) && e.querySelector('.main-svg')).length;
  let last = count(), since = performance.now();
  const tick = () => {
    const n = count(), now = performance.now();
    if (n !== last) { last = n; since = now; }
    if (now - since >= 2000 || now - t0 > 60000)
      requestIdleCallback(() => resolve((performance.now() - t0) / 1000), {timeout: 3000});
    else setTimeout(tick, 100);
  };
  tick();
})
"""


def settle(page: Any) -> float:
    """Wait until the page has drawn the last run's plots and is idle; the seconds it took."""
    return float(page.evaluate(SETTLE_JS))


# A page opened without a session: seconds from navigation start to its ready status.
PLAIN_LOAD_JS = """
() => new Promise((resolve) => {
  const tick = () => { const s = document.querySelector('#status');
    if (s && /Press Run/.test(s.textContent)) resolve(performance.now() / 1000); else setTimeout(tick, 10); };
  tick();
})
"""


def say(msg: str) -> None:
    """A progress line on stderr (the suite takes minutes; the section goes to stdout)."""
    import sys

    print(f"[ui {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load_average() -> float:
    """The 1-minute load average (NaN where the platform has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def cli_compare_s(preset: str) -> dict[str, float]:
    """Decode a preset's lanes in this process as ``playground compare`` does (models warm).

    Returns the wall time of all lanes, one after the other, preparation included. (The lanes'
    own ``wall_s`` would overlap: all are prepared before the first one decodes.)
    """
    from playground.api import plan_compare, prepare_lanes

    t0 = time.perf_counter()
    traces = [run.finish() for run in prepare_lanes(plan_compare(preset))]
    if any(t.stats.get("finish_reason") == "error" for t in traces):
        raise PlaygroundError(f"`playground compare --preset {preset}` failed in this process")
    return {"total_s": time.perf_counter() - t0}


def run_in_page(page: Any, timeout_ms: int = 300_000) -> dict[str, Any]:
    """Press Run on the loaded page and wait for the end; times in seconds from the click."""
    from playground.bench._browser import lanes_visible, seconds_in_status, status_text

    page.evaluate(RUN_JS, lanes_visible(page))
    try:
        # done is set only once the page has been busy and is idle again: the status of an
        # earlier run, still on screen right after the click, does not count.
        page.wait_for_function("() => window.__ui.done !== null", timeout=timeout_ms)
    except Exception as e:  # noqa: BLE001 - one line saying what the page showed
        raise PlaygroundError(f"the run did not finish within {timeout_ms / 1000:.0f} s: "
                              f"status {status_text(page)!r}") from e
    b = page.evaluate(READ_JS)
    parts = first_token_parts(page.evaluate(PROFILE_JS))
    if b["error"]:
        raise PlaygroundError(f"the run failed in the page: {b['error']}")
    status = b["status"] or status_text(page)
    t0 = b["t0"]
    lanes = {}
    for k, r in b["lanes"].items():
        span = (r["last"] - r["first"]) / 1000 if r["first"] is not None and r["last"] is not None else 0.0
        lanes[int(k)] = {"updates": r["updates"], "tokens": r["tokens"], "span_s": span,
                         "rate": (r["updates"] - 1) / span if span > 0 else float("nan")}
    return {"done_s": (b["done"] - t0) / 1000, "first_s": (b["first"] - t0) / 1000 if b["first"] else float("nan"),
            "page_says_s": seconds_in_status(status), "lanes": lanes, "parts": parts}


def _med(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def _cell(xs: list[float], fmt: str = ".2f") -> str:
    """Median with the range of ``xs`` in brackets."""
    ys = sorted(x for x in xs if x == x)
    if not ys:
        return "—"
    if len(ys) == 1:
        return f"{ys[0]:{fmt}}"
    return f"{statistics.median(ys):{fmt}} ({ys[0]:{fmt}}–{ys[-1]:{fmt}})"


def _verdict(value: float, target: float, higher_is_better: bool = False) -> str:
    if value != value:
        return "not measured"
    ok = value >= target if higher_is_better else value <= target
    return "met" if ok else "missed"


def run_suite(args: argparse.Namespace) -> str:
    """Measure the page and return the markdown section."""
    import torch

    from playground.bench import machine_line
    from playground.bench._browser import (app_and_browser, keep_lanes, load_preset, new_page, set_number,
                                           status_text, wait_idle)
    from playground.core.models import BUNDLED_DIR
    from playground.presets import load_preset as read_preset

    if not all((BUNDLED_DIR / m / "config.json").exists() for m in ("tiny-shakespeare", "tiny-shakespeare-draft")):
        raise PlaygroundError("the ui suite needs the bundled models; run `playground train-tiny` first")
    if not args.threads:
        torch.set_num_threads(1)  # as the app, which runs with OMP_NUM_THREADS=1
    reps = 1 if args.quick else max(1, min(args.repeats, 3))
    n_stream = 24 if args.quick else 128
    showdown = read_preset(SHOWDOWN)
    started = time.perf_counter()
    loads: list[float] = []
    pairs: list[tuple[dict[str, Any], dict[str, float]]] = []
    streams: dict[int, list[dict[str, Any]]] = {2: [], 6: []}
    stops: list[dict[str, Any]] = []
    replays: list[dict[str, Any]] = []
    back: dict[str, Any] | None = None
    plain_loads: list[float] = []
    say("starting the app and Chromium")
    with app_and_browser(threads=1) as (app, browser):
        say(f"app on {app.url} (log {app.log.name}); opening the page")
        page = new_page(browser, app.url)
        load_preset(page, showdown["title"].split(":")[0])
        say("warm-up run of the showdown")
        cold = run_in_page(page)  # the first run after start-up: loads the target and the draft in the app
        cli_compare_s(SHOWDOWN)  # warm-up here too
        for i in range(reps):  # page and CLI alternate, so a burst of load hits both
            settle(page)
            loads.append(load_average())
            if i % 2 == 0:
                pg = run_in_page(page)
                cli = cli_compare_s(SHOWDOWN)
            else:
                cli = cli_compare_s(SHOWDOWN)
                pg = run_in_page(page)
            pairs.append((pg, cli))
            say(f"showdown {i + 1}/{reps}: page {pg['done_s']:.2f} s, CLI {cli['total_s']:.2f} s")

        # The last showdown run is stored: share it, then replay it in fresh pages.
        page.click("#share")
        page.wait_for_function("() => { const e = document.querySelector('#share-link textarea, #share-link input');"
                               " return e && e.value.includes('?session='); }")
        link = page.locator("#share-link textarea, #share-link input").first.input_value()
        n_lanes = len(showdown["lanes"])
        for _ in range(reps + 1):  # the first replay warms the server's session path
            loads.append(load_average())
            say("replaying the shared session")
            ctx = browser.new_context(viewport=VIEW)
            try:
                q = ctx.new_page()
                q.goto(link)
                replays.append(q.evaluate(REPLAY_JS, n_lanes))
            finally:
                ctx.close()
        replays = replays[1:]
        for _ in range(reps):  # for comparison: the page without a session, to its ready status
            ctx = browser.new_context(viewport=VIEW)
            try:
                q = ctx.new_page()
                q.goto(app.url)
                plain_loads.append(q.evaluate(PLAIN_LOAD_JS))
            finally:
                ctx.close()

        for lanes in (2, 6):
            page = _fresh(page, browser, app.url)
            load_preset(page, STREAM_PRESET)
            keep_lanes(page, lanes)
            set_number(page, "max-new-tokens", n_stream)
            for _ in range(reps):
                settle(page)
                loads.append(load_average())
                say(f"streaming {lanes} lanes × {n_stream} tokens")
                streams[lanes].append(run_in_page(page))
            if lanes == 6:  # and once more without waiting for the last run's plots
                say(f"streaming {lanes} lanes × {n_stream} tokens, pressed right after the last run's Done")
                back = run_in_page(page)

        page = _fresh(page, browser, app.url)
        load_preset(page, STREAM_PRESET)
        set_number(page, "max-new-tokens", 480)
        for _ in range(reps):
            settle(page)
            loads.append(load_average())
            say("Run, then Stop")
            page.evaluate(RUN_JS, [1])
            # a few tokens of this run on screen (not the previous run's): then Stop
            page.wait_for_function("() => window.__ui.busy && window.__ui.lanes[1].updates >= 3"
                                   " && document.querySelectorAll('#lane-1-output .tok').length >= 5",
                                   timeout=120_000)
            r = page.evaluate(STOP_JS)
            page.evaluate(READ_JS)  # disconnects the run's observers
            if r["s"] is None:
                raise PlaygroundError(f"the page was not idle 120 s after Stop: status {status_text(page)!r}")
            # a Stop the page swallowed lets the run go on to "Done": count it, never time it as a Stop
            r["took"] = r["status"].startswith("Stopped")
            stops.append(r)
            wait_idle(page)
        page.context.close()
    loads.append(load_average())
    return _section(args, showdown, pairs, streams, stops, replays, loads, n_stream, reps,
                    time.perf_counter() - started, machine_line(), cold=cold, back=back, plain_loads=plain_loads)


def _fresh(page: Any, browser: Any, url: str) -> Any:
    """A new page in a new context (no tokens or observers left from the previous one)."""
    from playground.bench._browser import new_page

    page.context.close()
    return new_page(browser, url)


def first_parts_lines(parts: list[dict[str, float]], preset: str) -> list[str]:
    """The table of where Run → first token went, part by part (ms, median and range over the
    runs ``parts`` holds, as :func:`first_token_parts` made them); nothing when none was measured."""
    runs = [p for p in parts if p]
    if not runs:
        return []
    ms = lambda name: [r[name] * 1000.0 for r in runs if name in r]  # noqa: E731 - one cell's numbers
    total = _med([r["total"] for r in runs if "total" in r])
    lines = [f"Where Run → first token goes (*{preset}*, the runs above; ms, median and range; page and server "
             "marks on one clock, see `playground/ui/live_feed.py`). The parts follow each other; their medians "
             "need not add up to the total's.", "",
             "| part | from the previous mark to | ms |", "|---|---|---:|"]
    for name, what, _a, _b in FIRST_PARTS:
        if ms(name):
            lines.append(f"| {name} | {what.lstrip('→ ')} | {_cell(ms(name), '.0f')} |")
    lines.append(f"| **Run → first token shown** | | **{_cell(ms('total'), '.0f')}** |")
    if ms("first poll"):
        lines.append(f"| (the page's first poll left after) | | {_cell(ms('first poll'), '.0f')} |")
    lines += ["", f"First token {total:.2f} s against issue 35's target of ≤ {TARGETS['first35']:.1f} s "
              f"({_verdict(total, TARGETS['first35'])}).", ""]
    return lines


def _section(args: argparse.Namespace, showdown: dict[str, Any], pairs: list[tuple[dict[str, Any], dict[str, float]]],
             streams: dict[int, list[dict[str, Any]]], stops: list[dict[str, Any]], replays: list[dict[str, Any]],
             loads: list[float], n_stream: int, reps: int, elapsed: float, machine: str,
             cold: dict[str, Any] | None = None, back: dict[str, Any] | None = None,
             plain_loads: list[float] | None = None) -> str:
    page_s = [p["done_s"] for p, _c in pairs]
    cli_s = [c["total_s"] for _p, c in pairs]
    ratios = [p["done_s"] / c["total_s"] for p, c in pairs]
    firsts = [p["first_s"] for p, _c in pairs]
    stop_s = [s["s"] for s in stops if s.get("took")]
    stops_took = sum(1 for s in stops if s.get("took"))
    replay_s = [r["s"] for r in replays]
    shown_s = [r["shown_s"] for r in replays if r.get("shown_s") is not None]
    drawn_after = [r["s"] - r["shown_s"] for r in replays if r.get("shown_s") is not None]
    readable_s = [r["readable_s"] for r in replays if r.get("readable_s") is not None]
    quick = sum(1 for r in replays if r.get("quick"))
    view_s = [r["view_s"] for r in replays if r.get("view_s") is not None]
    in_view = [r.get("in_view", 0) for r in replays]
    lines = [
        "## UI: the Compare page in a browser (`--suite ui`)",
        "",
        machine,
        f"Headless Chromium and the app (`python app.py` on 127.0.0.1, `OMP_NUM_THREADS=1`, bundled models, warmed up "
        f"by one run) on the same machine as this process; {reps} repetition(s) of each measurement, median with "
        f"the range in brackets; {elapsed:.0f} s in all. Times are taken in the page (`performance.now()`, "
        "MutationObservers), not by the driver. Recorded, not asserted.",
        "",
        f"| measurement | value | target (issue 11) | |",
        "|---|---:|---:|---|",
        f"| *{showdown['title'].split(':')[0]}* ({len(showdown['lanes'])} lanes × {showdown['max_new_tokens']} tokens): "
        f"Run → Done in the page (s) | {_cell(page_s)} | | |",
        f"| the same preset decoded in this process as `playground compare` does (s) | {_cell(cli_s)} | | |",
        f"| ratio page / CLI (median of pairs) | **{_cell(ratios)}** | ≤ {TARGETS['ratio']:.1f} | "
        f"{_verdict(_med(ratios), TARGETS['ratio'])} |",
        f"| the page's own \"Done in X s\" | {_cell([p['page_says_s'] for p, _c in pairs if p['page_says_s'] is not None], '.1f')} | | |",
        *([f"| the first run after start-up (the app loads the models), Run → Done (s) and its ratio to the "
            f"CLI's median | {cold['done_s']:.2f} ({cold['done_s'] / _med(cli_s):.1f}×) | | |"] if cold else []),
        f"| Run → first token shown (s) | {_cell(firsts)} | ≤ {TARGETS['first']:.1f} | "
        f"{_verdict(_med(firsts), TARGETS['first'])} |",
        f"| Stop → idle (Run enabled, \"Stopped\"), 6 lanes (s) | {_cell(stop_s)} | ≤ {TARGETS['stop']:.1f} | "
        f"{_verdict(_med(stop_s), TARGETS['stop'])} |",
        f"| Stops that took effect (the page said \"Stopped\", not \"Done\") | {stops_took} of {len(stops)} | "
        f"every one | {'met' if stops and stops_took == len(stops) else 'missed'} |",
        f"| shared session replayed, every plot drawn, from navigation start (s) | {_cell(replay_s)} | "
        f"≤ {TARGETS['replay']:.1f}; ≤ {TARGETS['replay35']:.1f} (issue 35) | "
        f"{_verdict(_med(replay_s), TARGETS['replay'])}; {_verdict(_med(replay_s), TARGETS['replay35'])} |",
        *([f"| … every plot then in view drawn (plots are drawn on sight; {_med(in_view):.0f} in view at "
           f"{VIEW['width']} × {VIEW['height']}), from navigation start (s) | {_cell(view_s)} | | |"] if view_s else []),
        f"| shared session readable: every lane's text painted, from navigation start (s; the quick read "
        f"in the first HTML in {quick} of {len(replays)}) | {_cell(readable_s)} | ≤ {TARGETS['readable']:.1f} "
        f"(issue 35) | {_verdict(_med(readable_s), TARGETS['readable'])} |",
        f"| … of which: navigation start → status says \"Replaying\" (page loaded, session opened) | "
        f"{_cell(shown_s)} | | |",
        f"| … and \"Replaying\" → every plot drawn (s) | {_cell(drawn_after)} | | |",
        *([f"| for comparison: the page opened without a session, navigation start → ready (s) | "
           f"{_cell(plain_loads)} | | |"] if plain_loads else []),
        "",
    ]
    lines += first_parts_lines([p.get("parts") or {} for p, _c in pairs], showdown["title"].split(":")[0])
    if replays and not all(r["complete"] for r in replays):
        lines += [f"Replay: {sum(not r['complete'] for r in replays)} of {len(replays)} replays did not draw every "
                  f"plot within 120 s ({replays[-1]['drawn']} of {replays[-1]['plots']} drawn).", ""]
    else:
        lines += [f"Replay: {replays[0]['plots'] if replays else 0} plots drawn (progress strip and every lane's "
                  "inspector).", ""]
    lines += [f"Text updates per second of each lane while it streams (*{STREAM_PRESET}*, {n_stream} new tokens, "
              f"lockstep at equal compute): (updates − 1) / time between its first and last update; target "
              f"≥ {TARGETS['rate']:.0f} per second for every lane with 6 lanes.", "",
              "| lanes | lane | updates/s | updates | tokens shown | streaming (s) |",
              "|---|---|---:|---:|---:|---:|"]
    for n, runs in streams.items():
        if not runs:
            continue
        for k in sorted(runs[0]["lanes"]):
            rs = [r["lanes"][k] for r in runs]
            lines.append(f"| {n} | {k} | {_cell([r['rate'] for r in rs], '.1f')} | "
                         f"{_cell([r['updates'] for r in rs], '.0f')} | {_cell([r['tokens'] for r in rs], '.0f')} | "
                         f"{_cell([r['span_s'] for r in rs], '.1f')} |")
        worst = min(_med([r["lanes"][k]["rate"] for r in runs]) for k in runs[0]["lanes"])
        if n == 6:
            lines.append(f"| 6 | slowest lane | **{worst:.1f}** | | | |")
            lines.append("")
            lines.append(f"Slowest lane with 6 lanes: {worst:.1f} updates/s against the target of ≥ "
                         f"{TARGETS['rate']:.0f} ({_verdict(worst, TARGETS['rate'], higher_is_better=True)}).")
            if back:
                slow_back = min(r["rate"] for r in back["lanes"].values())
                lines.append(f"Each run above starts from a settled page (the last run's plots drawn). Pressed "
                             f"right after the last run's Done, while its plots were still being drawn: slowest "
                             f"lane {slow_back:.1f} updates/s, first token after {back['first_s']:.2f} s.")
    good = [x for x in loads if x == x]
    cores = os.cpu_count() or 1
    lines += ["", f"1-minute load average during the suite: {min(good):.1f}–{max(good):.1f} on {cores} cores"
              + (" — more than the app, Chromium and this process make by themselves: other jobs ran too, "
                 "so these figures are pessimistic and noisy." if max(good) > cores + 0.5 else
                 " (the app, Chromium and this process themselves, sharing the cores).") if good else ""]
    return "\n".join(lines) + "\n"
