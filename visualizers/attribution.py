"""Attribution as a heatmap over the text (the inspector's *Explain* panel).

Input: a result of :func:`playground.attribution.attribute` — ``ids``, ``texts`` and
``scores`` (one per context token), the ``target`` (and ``contrast``) token, the ``method``,
and, as the page stores it, ``prompt_tokens`` (how many of the context tokens are the prompt)
and ``target_text``/``contrast_text``. Each context token is drawn with a background whose
strength is its score relative to the largest magnitude: red pushed the model towards the
target (towards it rather than the contrast), blue away from it. Pure: a stored result replays
without a model.
"""

from __future__ import annotations

import html
from typing import Any

from visualizers._common import html_token, visible

POSITIVE = (220, 38, 38)  # towards the target
NEGATIVE = (37, 99, 235)  # away from it


def _shade(score: float, top: float) -> str:
    r, g, b = POSITIVE if score >= 0 else NEGATIVE
    a = min(1.0, abs(score) / top) * 0.75 if top > 0 else 0.0
    return f"rgba({r},{g},{b},{a:.3f})"


def attribution_html(res: dict[str, Any]) -> str:
    """The result as escaped HTML: a headline (what was explained, by which method, the
    completeness check for integrated gradients), then the prompt and the generated context
    with each token shaded by its score (hover: its score and rank), the strongest three
    outlined, and the explained token at the end."""
    if not isinstance(res, dict):
        return '<div class="note">no attribution</div>'
    texts = [str(t) for t in res.get("texts") or []]
    scores = [float(s) for s in res.get("scores") or []]
    if not texts or len(texts) != len(scores):
        return '<div class="note">this attribution has no per-token scores</div>'
    n_prompt = res.get("prompt_tokens")
    n_prompt = n_prompt if isinstance(n_prompt, int) and 0 <= n_prompt <= len(texts) else None
    top = max(abs(s) for s in scores)
    order = sorted(range(len(scores)), key=lambda j: -abs(scores[j]))
    rank = {j: r for r, j in enumerate(order)}
    spans = []
    for j, (t, s) in enumerate(zip(texts, scores)):
        if n_prompt is not None and j == n_prompt:
            spans.append('<span class="attr-split" title="the generated tokens start here">│</span>')
        outline = ";outline:2px solid #111" if rank[j] < 3 and s != 0 else ""
        spans.append(f'<span class="attr-tok" data-score="{s:.6g}" style="background:{_shade(s, top)}{outline}" '
                     f'title="{html.escape(f"{visible(t)}: {s:+.4f} (rank {rank[j] + 1} of {len(scores)})")}">'
                     f'{html_token(t)}</span>')
    target = html.escape(visible(str(res.get("target_text") or f"#{res.get('target')}")))
    what = f"<b>{target}</b>"
    if res.get("contrast") is not None:
        what += f" rather than <b>{html.escape(visible(str(res.get('contrast_text') or '#' + str(res['contrast']))))}</b>"
    method = "integrated gradients" if res.get("method") == "integrated_gradients" else "gradient × input"
    head = f"Why {what} at step {res.get('step', '?')} · {method}"
    if res.get("method") == "integrated_gradients" and all(isinstance(res.get(k), (int, float))
                                                           for k in ("sum", "f", "f_baseline")):
        head += (f" ({res.get('steps')} steps, {res.get('baseline')} baseline: attributions sum to "
                 f"{res['sum']:+.3f}, f(x) − f(baseline) = {res['f'] - res['f_baseline']:+.3f})")
    strongest = ", ".join(f"{html.escape(visible(texts[j]))} {scores[j]:+.3f}" for j in order[:3])
    return (f'<div class="attribution"><div class="attr-head">{head}</div>'
            f'<div class="attr-text" style="white-space:pre-wrap;line-height:1.9">{"".join(spans)}'
            f'<span class="attr-target" style="outline:2px dashed #111">{target}</span></div>'
            f'<div class="attr-legend">red: pushed towards it · blue: away · outlined: the strongest '
            f'({strongest})</div></div>')


__all__ = ["attribution_html"]
