"""The Results tab: which decoder configuration readers preferred in blind votes.

Pools the ballots of blind comparisons (:mod:`playground.votes`: by model, decoder and knobs,
not the seed) into a Bradley–Terry table with 95% bootstrap intervals, drawn as a forest plot
(:func:`visualizers.votes.strengths_figure`), with the readers' reasons below. Whose ballots: on
one user's instance every stored ballot; on a hosted one those on the comparisons this browser
made and those it voted on itself (a reader sees a table only of what they may already see).
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from playground.core.errors import PlaygroundError
from playground.ownership import one_user, owner_id
from playground.store import Store, default_store
from playground.ui.compare import ComparePage
from playground.ui.html import esc, status_html
from playground.votes import Results, format_interval, results
from visualizers.votes import strengths_figure

HEADERS = ["Configuration", "Score", "95% interval", "Won", "Lost", "Tied", "Sessions"]
MAX_REASONS = 200  # the newest reasons listed under the table


def ballot_scope(store: Store, owner_key: Any) -> list[str] | None:
    """The sessions whose ballots the caller's Results pool: None (every one) for one user;
    on a hosted instance the caller's own comparisons and those they voted on."""
    if one_user():
        return None
    who = owner_id(owner_key)
    if who is None:
        return []
    return list(dict.fromkeys(store.owned_sessions(who) + store.voted_sessions(who)))


def caller_results(owner_key: Any) -> Results:
    """The Results table the caller may see (:func:`ballot_scope`)."""
    store = default_store()
    scope = ballot_scope(store, owner_key)
    if scope is not None and not scope:
        return results([], [])
    ballots = store.ballots(scope)
    voted = list(dict.fromkeys(b["session"] for b in ballots))
    return results([store.load_session(s) for s in voted], ballots)


def table_rows(res: Results) -> list[list[str]]:
    """The table's rows, best first."""
    return [[r.label, f"{r.score:+.2f}", format_interval(r.low, r.high), str(r.wins), str(r.losses), str(r.ties),
             str(r.sessions)] for r in res.rows]


def reasons_html(res: Results) -> str:
    """The readers' reasons, each under what it was given for (escaped)."""
    if not res.reasons:
        return '<div class="lane-info">No reasons given yet.</div>'
    items = "".join(f"<li><b>{esc(r['label'])}</b>: {esc(r['reason'])}</li>" for r in res.reasons[-MAX_REASONS:][::-1])
    return f'<div class="lane-info"><p>Readers\' reasons, newest first:</p><ul>{items}</ul></div>'


class ResultsView:
    """The tab's components and handlers; ``page`` gives the browser's owner key."""

    def __init__(self, page: ComparePage) -> None:
        self.page = page

    def build(self) -> None:
        """Create the components (call inside the Results tab)."""
        gr.Markdown("Blind votes, pooled per decoder configuration (model, decoder and knobs; repeats with other "
                    "seeds pool). Tick **Blind vote** by Share on the Compare tab and hand out the link: readers see "
                    "the lanes as letters, vote, and then see the decoders. The table is a Bradley–Terry fit with "
                    "95% bootstrap intervals over ballots.", elem_classes=["lane-info"])
        with gr.Row(equal_height=True):
            self.refresh = gr.Button("↻ Refresh", elem_id="results-refresh", scale=1)
            self.status = gr.HTML("", elem_id="results-status")
        self.plot = gr.Plot(elem_id="results-plot", show_label=False)
        self.table = gr.Dataframe(value=[], headers=HEADERS, datatype="str", interactive=False, wrap=True,
                                  elem_id="results-table")
        self.reasons = gr.HTML("", elem_id="results-reasons")

    def wire(self, demo: gr.Blocks, tab: Any) -> None:
        """Attach the events (hidden from the public API); the tab refreshes when selected."""
        out = [self.status, self.plot, self.table, self.reasons]
        self.refresh.click(self.on_refresh, [self.page.owner_key], out)
        tab.select(self.on_refresh, [self.page.owner_key], out)

    def on_refresh(self, owner_key: Any = None) -> list[Any]:
        """Fit the ballots the caller may see and show the table, the plot and the reasons."""
        try:
            res = caller_results(owner_key)
        except PlaygroundError as e:
            return [status_html(str(e), "error"), gr.skip(), gr.skip(), gr.skip()]
        line = (f"{res.ballots} ballot{'s' if res.ballots != 1 else ''} over {res.sessions} blind "
                f"comparison{'s' if res.sessions != 1 else ''}." if res.ballots else
                "No votes yet: share a blind comparison (tick Blind vote by Share) and collect ballots.")
        return [status_html(line, "ok" if res.ballots else "info"), strengths_figure(res.rows, res.ballots, res.sessions),
                table_rows(res), reasons_html(res)]
