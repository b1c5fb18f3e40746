"""The inspector's branch panel: "what if this lane had picked another token here?"

Click a token (or scrub) and the panel offers the step's recorded top-K
(:func:`playground.branching.token_choices`) or typed text that is one token
(:func:`~playground.branching.resolve_token`); *Branch* runs the lane — or every lane — on from
the edited prefix as a branch of the stored session (:func:`~playground.branching.branch_session`)
and opens it in the page: the parent's lane beside the branched one, the divergence strip and
the forced-token plot marking where they part. A branch is an ordinary stored session (share
link, Sessions view); *Open the parent* goes back up the tree.

A diffusion lane is branched at its canvas instead (a hand on the canvas,
:func:`~playground.branching.branch_canvas`): the scrubber's step is where the lane pauses (an
earlier step rewinds it), the panel lists the positions still masked there with the model's top-1
at each (``#branch-canvas-positions``), one position's token may be picked from its recorded
top-K (``#branch-canvas-at``, ``#branch-canvas-token``), and *Continue* (``#branch-continue``)
runs the lane on with the reader's commits at that step, opened beside the parent's lane.
A click on one of those masked cells where the canvas is shown (the lane's canvas view at that
step, or a mask in the lane's output) ticks or unticks its position (:func:`toggle_cell`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import gradio as gr

from playground import blind, engine
from playground.branching import (branch_canvas, branch_session, canvas_choices, masked_at, resolve_token,
                                  step_position, token_choices)
from playground.core.errors import PlaygroundError
from playground.core.settings import limits
from playground.hosting import gpu, model_event_settings
from playground.ownership import one_user, owner_id
from playground.store import default_store
from playground.ui.events import clicked_cell, clicked_token, nothing_is_skip
from playground.ui.html import esc, one_line, status_html
from playground.ui.layout import Layout


log = logging.getLogger(__name__)

SCOPE_CHOICES = [("this lane only", "one"), ("every lane from this prefix", "all")]
HINT = "Click a token in any lane (or scrub) to pick the lane and step to branch from."


@dataclass
class Target:
    """What the panel would branch: a lane (0-based), its step, and what that step committed."""

    lane: int
    step: int
    position: int | None = None
    token: str = ""
    problem: str = ""  # why this step cannot be branched ("" when it can)


def lane_choices(traces: list[dict[str, Any]] | None, max_lanes: int) -> list[tuple[str, int]]:
    """The lane picker's choices: ``("Lane k · decoder", k - 1)`` for every lane shown."""
    traces = list(traces or [])
    if not traces:
        return [(f"Lane {k}", k - 1) for k in range(1, max_lanes + 1)]
    return [(f"Lane {j + 1} · {t.get('decoder') or '?'}", j) for j, t in enumerate(traces[:max_lanes])]


def target(traces: list[dict[str, Any]] | None, lane: Any, step: Any) -> Target:
    """The lane and step a branch would replace a token of: the scrubber's step, clamped to the
    lane's last step as the inspector shows it, with a one-line ``problem`` when it cannot be."""
    traces = list(traces or [])
    j = _int(lane, 0)
    s = max(0, _int(step, 0))
    if not traces:
        # also while a run streams: the page holds its traces only once it has ended
        return Target(j, s, problem="nothing to branch yet: run a comparison (or open a session) and let it end")
    if not 0 <= j < len(traces):
        return Target(j, s, problem=f"the comparison has no lane {j + 1}")
    trace = traces[j]
    steps = trace.get("steps") or []
    if not steps:
        return Target(j, s, problem=f"lane {j + 1} made no step to branch from")
    s = min(s, len(steps) - 1)
    try:
        pos = step_position(trace, s)
    except PlaygroundError as e:
        return Target(j, s, problem=str(e))
    out = trace.get("output_ids") or []
    text = ""
    if pos < len(out):
        text = (trace.get("tokens") or {}).get(str(out[pos]), f"#{out[pos]}")
    return Target(j, s, position=pos, token=text)


def where_html(t: Target, traces: list[dict[str, Any]] | None) -> str:
    """The panel's line saying what a branch would replace (or why it cannot)."""
    if t.problem:
        return f'<div class="branch-where branch-blocked">{esc(t.problem)}</div>'
    dec = (list(traces or [])[t.lane].get("decoder") or "?") if traces else "?"
    return (f'<div class="branch-where" data-lane="{t.lane}" data-step="{t.step}" data-position="{t.position}">'
            f'Lane {t.lane + 1} · {esc(dec)}, step {t.step} (output position {t.position}) committed '
            f'<code>{esc(repr(t.token))}</code>. Put another token in its place:</div>')


def is_diffusion(traces: list[dict[str, Any]] | None, lane: int) -> bool:
    """Whether lane ``lane`` of the shown traces is a diffusion lane (its steps are denoise steps)."""
    traces = list(traces or [])
    if not 0 <= lane < len(traces):
        return False
    steps = traces[lane].get("steps") or []
    return bool(steps) and steps[0].get("kind") == "denoise"


def canvas_offer(trace: dict[str, Any], step: int) -> list[tuple[str, int]]:
    """The positions a reader may commit at a diffusion step, each with the model's top-1 there:
    ``("position 3: 'the'  p=0.41", 3)``."""
    out = []
    for p in masked_at(trace, step):
        top = canvas_choices(trace, step, p)
        out.append((f"position {p}: {top[0][0]}" if top else f"position {p}", p))
    return out


def canvas_where_html(t: Target, traces: list[dict[str, Any]] | None, masked: int) -> str:
    """The panel's line for a diffusion lane paused at a step."""
    dec = list(traces or [])[t.lane].get("decoder") or "?"
    return (f'<div class="branch-where branch-canvas-where" data-lane="{t.lane}" data-step="{t.step}">'
            f'Lane {t.lane + 1} · {esc(dec)} paused at step {t.step}: {masked} positions still masked. '
            'Choose which to commit at this step (each takes the model\'s top-1, or pick one\'s token), then '
            'Continue; pick an earlier step to rewind.</div>')


def hand_commit(positions: Any, at: Any, token: Any) -> dict[int, int | None]:
    """The reader's commits from the canvas controls: every ticked position at the model's top-1
    (None), and the position picked in the token list with its chosen token."""
    commit: dict[int, int | None] = {int(p): None for p in (positions or [])}
    if at not in (None, ""):
        if token in (None, ""):
            raise PlaygroundError(f"pick a token for position {at} from its top-K (or clear the position)")
        commit[int(at)] = int(token)
    if not commit:
        raise PlaygroundError("choose at least one masked position to commit")
    return commit


@dataclass
class CanvasPick:
    """The canvas controls' values: the ticked positions, the position picked for its token and
    that token (None for none)."""

    positions: list[int]
    at: int | None
    token: int | None


def toggle_cell(trace: dict[str, Any], step: int, pos: int, positions: Any, at: Any, token: Any) -> CanvasPick:
    """The controls after a click on the canvas cell at ``pos``: the position joins the commits
    (ticked, and picked for its token so the reader sees its top-K, top-1 chosen) or, when it is
    committed already, leaves them. Every other committed position keeps its token: a position
    picked with a token other than its top-1 stays picked, one at its top-1 stays ticked."""
    ticked = sorted({int(p) for p in (positions or [])})
    at_i = None if at in (None, "") else int(at)
    tok = None if token in (None, "") else int(token)
    if pos in ticked or pos == at_i:
        ticked = [p for p in ticked if p != pos]
        return CanvasPick(ticked, None, None) if at_i == pos else CanvasPick(ticked, at_i, tok)
    ticked = sorted(ticked + [pos])
    top = canvas_choices(trace, step, pos)
    if at_i is None:
        return CanvasPick(ticked, pos, top[0][1] if top else None)
    at_top = canvas_choices(trace, step, at_i)
    if tok is None or (at_top and tok == at_top[0][1]):
        # the picked position was at its top-1, which a tick commits as well: it stays, ticked
        return CanvasPick(sorted(set(ticked) | {at_i}), pos, top[0][1] if top else None)
    return CanvasPick(ticked, at_i, tok)


def check_can_run() -> None:
    """Refuse on a replay-only instance: a branch runs the model."""
    if limits().no_models:
        raise PlaygroundError("branching runs the model, and model loading is disabled on this instance "
                              "(replay only)")


def pick_token(traces: list[dict[str, Any]], t: Target, choice: Any, typed: Any) -> int:
    """The replacement token: typed text (one token of the lane's tokenizer, or a token id)
    when given, else the token picked from the step's top-K."""
    text = "" if typed is None else str(typed)
    if text != "":
        tokenizer = None
        if not text.strip().isdigit():
            check_can_run()  # the tokenizer comes with the lane's model

            tokenizer = engine.load_model(traces[t.lane]["model"]).tokenizer
        return resolve_token(text, tokenizer)
    if choice in (None, ""):
        raise PlaygroundError("pick a token from the list or type text that is one token")
    return resolve_token(int(choice))


def run_branch(sid: str, lane: int, token: int, step: int, scope: str, owner_key: Any = None) -> str:
    """Run the branch (with the model, under the hosting's GPU wrapper) and store it as the
    branching browser's; its id. It is filed under its parent only where the caller may change
    the parent (:mod:`playground.ownership`)."""
    store = default_store()
    blind.check_readable(store, sid, owner_key)  # a branch would replay the hidden lanes
    attach = one_user() or (owner_id(owner_key) is not None and store.session_owner(sid) == owner_id(owner_key))
    return gpu(branch_session)(store, sid, lane, token, step=step, lanes=scope, owner=owner_id(owner_key),
                               attach=attach)


def run_canvas(sid: str, lane: int, step: int, commit: dict[int, int | None], owner_key: Any = None) -> str:
    """Run a canvas branch (the reader's commits at ``step``) and store it, filed as
    :func:`run_branch` files a token branch; its id."""
    store = default_store()
    blind.check_readable(store, sid, owner_key)
    attach = one_user() or (owner_id(owner_key) is not None and store.session_owner(sid) == owner_id(owner_key))
    return gpu(branch_canvas)(store, sid, lane, step, commit, restrict=True, owner=owner_id(owner_key),
                              attach=attach)


def branch_note(session: dict[str, Any]) -> str:
    """One line saying what an opened branch shows and where it parts from its parent."""
    b = session.get("branch") or {}
    shown = repr(b["text"]) if "text" in b else f"#{b.get('token')}"
    lane = int(b.get("lane", 0)) + 1
    if b.get("hand"):
        more = len(b["hand"]) - 1
        return (f"Branch: lane 1 is the parent's lane {lane} as it ran, lane 2 the same lane with your commits at "
                f"step {b.get('step')}: position {b.get('position')} ← {shown}"
                + (f" and {more} more" if more else "") + " — then its own rule.")
    if b.get("lanes") == "all":
        return (f"Branch: every lane continued from lane {lane}'s prefix with {shown} forced at output position "
                f"{b.get('position')} (step {b.get('step')}). Open the parent to compare with the original.")
    return (f"Branch: lane 1 is the parent's lane {lane} as it ran, lane 2 the same lane with {shown} forced at "
            f"output position {b.get('position')} (step {b.get('step')}) — the strip marks where they part.")


class BranchPanel:
    """The branch controls of the Compare page's inspector and their handlers."""

    def __init__(self, ui: Layout, open_session: Callable[[Any], dict[Any, Any]]) -> None:
        """``ui``: the page's components; ``open_session``: shows a stored session in the page
        (the lane configuration's), which is how a finished branch or its parent is opened."""
        self.ui, self.open_session = ui, open_session

    # ================================================================== components
    def build(self) -> None:
        """Create the panel (inside the page's inspector section)."""
        page = self.ui
        with gr.Accordion("Branch: what if this lane had picked another token here?", open=False,
                          elem_id="branch-panel", elem_classes=["branch-panel"]) as acc:
            self.accordion = acc
            self.where = gr.HTML(f'<div class="branch-where">{esc(HINT)}</div>', elem_id="branch-where")
            with gr.Row(equal_height=True):
                self.lane = gr.Dropdown(lane_choices([], page.max_lanes), value=0, label="Lane",
                                        elem_id="branch-lane", scale=1, min_width=140)
                self.choice = gr.Dropdown([], value=None, label="Replacement: the step's top-K (model's p)",
                                          elem_id="branch-token", scale=3, min_width=220)
                self.typed = gr.Textbox(label="…or type text that is one token (or a token id)",
                                        elem_id="branch-text", max_lines=1, scale=2, min_width=180)
            with gr.Column(visible=False, elem_id="branch-canvas") as canvas:
                self.canvas = canvas
                self.canvas_pos = gr.CheckboxGroup([], label="Commit at this step: the masked positions "
                                                   "(each at the model's top-1)", elem_id="branch-canvas-positions")
                with gr.Row(equal_height=True):
                    self.canvas_at = gr.Dropdown([], value=None, label="…and pick the token of one position",
                                                 elem_id="branch-canvas-at", scale=1, min_width=140)
                    self.canvas_token = gr.Dropdown([], value=None, label="its top-K (model's p)",
                                                    elem_id="branch-canvas-token", scale=3, min_width=220)
                    self.canvas_run = gr.Button("Continue", variant="primary", elem_id="branch-continue",
                                                scale=1, min_width=110)
            with gr.Row(equal_height=True):
                self.scope = gr.Radio(SCOPE_CHOICES, value="one", label="Continue", elem_id="branch-scope",
                                      scale=3, min_width=260)
                self.button = gr.Button("Branch", variant="primary", elem_id="branch-run", scale=1, min_width=110)
                self.parent_btn = gr.Button("Open the parent session", elem_id="branch-parent", visible=False,
                                            scale=1, min_width=150)
            self.status = gr.HTML("", elem_id="branch-status")
        self.parent = gr.State(None)

    def pick_outputs(self) -> list[Any]:
        """What picking a lane and step rewrites."""
        return [self.where, self.lane, self.choice, self.typed, self.scope, self.button, self.canvas,
                self.canvas_pos, self.canvas_at, self.canvas_token]

    # ================================================================== events
    def wire(self, demo: gr.Blocks) -> None:
        """Attach token clicks, scrubbing, the lane picker, Branch and Open the parent."""
        page = self.ui
        for ui in page.lanes:
            ui.output.click(nothing_is_skip(self.on_click), [page.traces, self.lane], self.pick_outputs() + [self.accordion],
                            show_progress="hidden")
        page.step.input(self.on_pick, [page.traces, self.lane, page.step], self.pick_outputs(),
                        show_progress="hidden", trigger_mode="always_last")
        self.lane.input(self.on_pick, [page.traces, self.lane, page.step], self.pick_outputs(),
                        show_progress="hidden")
        # a finished run or an opened session (a branch too) fills the traces
        page.on_shown.add(self.on_pick, [page.traces, self.lane, page.step], self.pick_outputs())
        # the session id is only ever written with a new `shown`: the parent follows it there
        page.on_shown.add(self.on_sid, [page.sid], [self.parent, self.parent_btn])
        # The status first, unqueued: the page says at once that the branch is on its way (it may
        # wait for a model slot); the model work follows in the shared model group.
        self.button.click(self.on_pressed, None, [self.status, self.button], queue=False, show_progress="hidden") \
            .then(self.on_branch, [page.sid, page.traces, self.lane, page.step, self.choice, self.typed, self.scope,
                                   page.owner_key],
                  page.page_outputs() + [self.status, self.button], show_progress="hidden",
                  **model_event_settings())
        # a click on a masked cell (token_click.js sends it as `select`) ticks or unticks it
        for ui in page.lanes:
            ui.output.select(nothing_is_skip(self.on_cell), [page.traces, self.lane, page.step, self.canvas_pos,
                                                             self.canvas_at, self.canvas_token],
                             self.pick_outputs() + [self.accordion], show_progress="hidden", queue=False)
        self.canvas_at.input(self.on_canvas_at, [page.traces, self.lane, page.step, self.canvas_at],
                             [self.canvas_token], show_progress="hidden")
        self.canvas_run.click(self.on_continue_pressed, None, [self.status, self.canvas_run], queue=False,
                              show_progress="hidden") \
            .then(self.on_continue, [page.sid, page.traces, self.lane, page.step, self.canvas_pos, self.canvas_at,
                                     self.canvas_token, page.owner_key],
                  page.page_outputs() + [self.status, self.canvas_run], show_progress="hidden",
                  **model_event_settings())
        self.parent_btn.click(self.on_parent, [self.parent], page.page_outputs() + [self.status],
                              show_progress="hidden")

    # ================================================================== handlers
    def on_pick(self, traces: list[dict[str, Any]] | None, lane: Any, step: Any) -> dict[Any, Any]:
        """Show what branching lane ``lane`` at ``step`` would replace, and its top-K."""
        t = target(traces, lane, step)
        up = {self.lane: gr.update(choices=lane_choices(traces, self.ui.max_lanes), value=t.lane)}
        if is_diffusion(traces, t.lane):
            offer = canvas_offer(list(traces or [])[t.lane], t.step)
            return {**up, self.where: canvas_where_html(t, traces, len(offer)),
                    self.choice: gr.update(visible=False, value=None), self.typed: gr.update(visible=False, value=""),
                    self.scope: gr.update(visible=False), self.button: gr.update(visible=False),
                    self.canvas: gr.update(visible=True), self.canvas_pos: gr.update(choices=offer, value=[]),
                    self.canvas_at: gr.update(choices=offer, value=None),
                    self.canvas_token: gr.update(choices=[], value=None)}
        choices = [] if t.problem else token_choices(list(traces or [])[t.lane], t.step)
        return {**up, self.where: where_html(t, traces),
                self.choice: gr.update(choices=choices, value=None, visible=True),
                self.typed: gr.update(value="", visible=True), self.scope: gr.update(visible=True),
                self.button: gr.update(visible=True), self.canvas: gr.update(visible=False),
                self.canvas_pos: gr.update(choices=[], value=[]), self.canvas_at: gr.update(choices=[], value=None),
                self.canvas_token: gr.update(choices=[], value=None)}

    def on_canvas_at(self, traces: list[dict[str, Any]] | None, lane: Any, step: Any, at: Any) -> dict[Any, Any]:
        """A position was picked for its token: offer its recorded top-K, the top-1 chosen."""
        t = target(traces, lane, step)
        if at in (None, "") or not is_diffusion(traces, t.lane):
            return {self.canvas_token: gr.update(choices=[], value=None)}
        choices = canvas_choices(list(traces or [])[t.lane], t.step, int(at))
        return {self.canvas_token: gr.update(choices=choices, value=choices[0][1] if choices else None)}

    def on_cell(self, traces: list[dict[str, Any]] | None, lane: Any, step: Any, positions: Any, at: Any,
                token: Any, evt: gr.EventData) -> dict[Any, Any]:
        """A masked cell of a diffusion lane was clicked: pause that lane at the scrubber's step
        (unless the panel holds it there already, with the reader's ticks) and tick or untick
        the position; nothing when the step does not offer it."""
        hit = clicked_cell(evt)
        if hit is None:
            return {}
        cell_lane, cell_step, pos = hit
        t = target(traces, cell_lane, step)
        if not is_diffusion(traces, t.lane) or cell_step not in (None, t.step):
            return {}  # (a view of another step than the scrubber's is stale)
        trace = list(traces or [])[t.lane]
        if pos not in masked_at(trace, t.step):
            return {}
        fresh = t.lane != _int(lane, -1)
        up: dict[Any, Any] = {self.accordion: gr.update(open=True)}
        if fresh:  # another lane than the panel holds: pause it there afresh
            up.update(self.on_pick(traces, t.lane, t.step))
            positions, at, token = [], None, None
        pick = toggle_cell(trace, t.step, pos, positions, at, token)
        offer = {"choices": canvas_offer(trace, t.step)} if fresh else {}
        choices = [] if pick.at is None else canvas_choices(trace, t.step, pick.at)
        up.update({self.canvas_pos: gr.update(value=pick.positions, **offer),
                   self.canvas_at: gr.update(value=pick.at, **offer),
                   self.canvas_token: gr.update(choices=choices, value=pick.token)})
        return up

    def on_continue(self, sid: Any, traces: list[dict[str, Any]] | None, lane: Any, step: Any, positions: Any,
                    at: Any, token: Any, owner_key: Any = None) -> dict[Any, Any]:
        """Run the canvas branch, store it and open it in the page; a failure is one line."""
        done = {self.canvas_run: gr.update(interactive=True)}
        try:
            check_can_run()
            t = target(traces, lane, step)
            if not is_diffusion(traces, t.lane):
                raise PlaygroundError(t.problem or f"lane {t.lane + 1} is not a diffusion lane")
            if not sid:
                raise PlaygroundError("this comparison is not stored yet: run it (or open a session) first")
            bid = run_canvas(str(sid), t.lane, t.step, hand_commit(positions, at, token), owner_key)
        except Exception as e:  # noqa: BLE001 - every failure is one line (failed)
            return self.failed(e, done, "canvas branch")
        return self.opened(bid, done)

    def on_click(self, traces: list[dict[str, Any]] | None, lane: Any, evt: gr.EventData) -> dict[Any, Any]:
        """A token was clicked: branch from its lane and step (the panel opens)."""
        hit = clicked_token(evt)
        if hit is None:
            return {}
        clicked, step = hit
        return {**self.on_pick(traces, lane if clicked is None else clicked, step), self.accordion: gr.update(open=True)}

    def on_sid(self, sid: Any) -> dict[Any, Any]:
        """The page shows another session: offer its parent when it is a branch."""
        parent = None
        if sid:
            try:
                parent = default_store().load_session(str(sid)).get("parent")
            except PlaygroundError:
                parent = None
        return {self.parent: parent, self.parent_btn: gr.update(visible=bool(parent))}

    def on_pressed(self) -> dict[Any, Any]:
        """Branch was pressed: say so at once and hold the button until the branch is shown."""
        return {self.status: status_html("Branching… (running the lane on from the edited prefix)"),
                self.button: gr.update(interactive=False)}

    def on_continue_pressed(self) -> dict[Any, Any]:
        """Continue was pressed: say so at once and hold the button until the branch is shown."""
        return {self.status: status_html("Continuing… (the lane replays to the step, takes your commits and runs on)"),
                self.canvas_run: gr.update(interactive=False)}

    def on_branch(self, sid: Any, traces: list[dict[str, Any]] | None, lane: Any, step: Any, choice: Any,
                  typed: Any, scope: Any, owner_key: Any = None) -> dict[Any, Any]:
        """Run the branch, store it and open it in the page; a failure is one line."""
        done = {self.button: gr.update(interactive=True)}
        try:
            check_can_run()
            t = target(traces, lane, step)
            if t.problem:
                raise PlaygroundError(t.problem)
            if not sid:
                raise PlaygroundError("this comparison is not stored yet: run it (or open a session) first")
            token = pick_token(list(traces or []), t, choice, typed)
            bid = run_branch(str(sid), t.lane, token, t.step, scope if scope in ("one", "all") else "one", owner_key)
        except Exception as e:  # noqa: BLE001 - every failure is one line (failed)
            return self.failed(e, done, "branch")
        return self.opened(bid, done)

    def failed(self, e: Exception, done: dict[Any, Any], what: str) -> dict[Any, Any]:
        """A branch that could not run, as one status line (a bug also goes to the log with its traceback)."""
        if isinstance(e, PlaygroundError):
            return {self.status: status_html(one_line(str(e)), "error"), **done}
        log.exception("%s failed", what, exc_info=e)
        return {self.status: status_html(one_line(f"the branch failed: {type(e).__name__}: {e}"), "error"), **done}

    def opened(self, bid: str, done: dict[Any, Any]) -> dict[Any, Any]:
        """The stored branch ``bid`` opened in the page, its note in the status line."""
        up = self.open_session(bid)
        up[self.status] = status_html(branch_note(default_store().load_session(bid)), "ok")
        up.update(done)
        return up

    def on_parent(self, parent: Any) -> dict[Any, Any]:
        """Open the parent of the branch the page shows."""
        if not parent:
            return {self.status: status_html("this session is not a branch", "error")}
        return {**self.open_session(parent), self.status: ""}


def _int(x: Any, default: int) -> int:
    try:
        return int(x)
    except (TypeError, ValueError, OverflowError):
        return default


__all__ = ["BranchPanel", "CanvasPick", "SCOPE_CHOICES", "Target", "branch_note", "canvas_offer", "canvas_where_html",
           "check_can_run", "hand_commit", "is_diffusion", "lane_choices", "pick_token", "run_branch", "run_canvas",
           "target", "toggle_cell", "where_html"]
