"""The output as HTML, each token coloured by a metric, plus its legend and a stats line.

Every token is ``<span class="tok" data-lane=".." data-step=".." title="..">text</span>``;
``data-step`` is the index of the step that produced the token, so the page can jump the
step scrubber to it on click; a diffusion canvas's cells also carry ``data-pos`` (the
position), so a click on a masked cell can choose that position for a hand on the canvas.
Token text is always HTML-escaped. Colours are translucent backgrounds so the text stays
readable on light and dark pages.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any

from playground.core.trace import FIGURE_NAMES, committed_count, step_figures
from visualizers._common import METRICS, html_token, ints, num, steps_of, token_text, visible
from visualizers.canvas import commit_state, canvas_of, denoise_steps, is_masked, mask_id_of, MASK_GLYPH
from visualizers.dist import chosen_probs
from visualizers.tree import accepted_ids, tree_nodes
from visualizers.watermark import GREEN_BG, RED_BG

ENTROPY_MAX = 5.0  # nats at which the entropy colour saturates (fixed, so colours don't shift live)
# Probability is coloured on a log scale from p = 1 (faint) to PROB_FLOOR (full): a small
# model gives most chosen tokens p < 0.3, which a linear scale painted almost uniformly dark.
PROB_FLOOR = 1e-3

_ACCEPT_BG = {"accepted": "rgba(34,165,91,0.30)", "correction": "rgba(240,122,26,0.42)",
              "bonus": "rgba(59,130,246,0.38)", "small": "rgba(20,184,166,0.35)", "target": ""}
_ACCEPT_LABEL = {"accepted": "accepted draft token", "correction": "target correction (resampled)",
                 "bonus": "bonus token from the target", "target": "target step (no draft)",
                 "provisional": "best beam so far (provisional)",
                 "small": "written by the small model (EAD: draft slot)"}
_STEP_STOPS = [(59, 130, 246), (20, 184, 166), (132, 204, 22), (250, 204, 21)]


@dataclass
class TokenRec:
    """One output token (or canvas position) and what the trace says about it."""

    id: int | None
    step: int
    text: str
    prob: float | None = None
    final: float | None = None
    entropy: float | None = None
    accept: str = "target"
    masked: bool = False
    green: bool | None = None  # watermark: in its green list (None: not a watermarked or scored token)


def _is_done(trace: dict[str, Any]) -> bool:
    if "done" in trace:
        return bool(trace.get("done"))
    stats = trace.get("stats")
    return isinstance(stats, dict) and bool(stats.get("finish_reason"))


def _step_records(trace: dict[str, Any], s: dict[str, Any]) -> list[TokenRec]:
    """Records of the tokens one non-denoise step committed, with their evidence."""
    i = s.get("i") if isinstance(s.get("i"), int) else 0
    committed = ints(s.get("committed"))
    kind = s.get("kind")
    recs = [TokenRec(t, i, token_text(trace, t)) for t in committed]
    if kind == "token" and isinstance(s.get("dist"), dict):
        d = s["dist"]
        raw, fin = chosen_probs(d)
        for r in recs:
            if r.id == d.get("chosen"):
                r.prob, r.final, r.entropy = raw, fin, num(d.get("entropy"))
            if s.get("source") == "small":  # EAD: which model wrote the token
                r.accept = "small"
        wm = s.get("watermark")
        if isinstance(wm, dict) and isinstance(wm.get("green"), bool) and recs:
            recs[0].green = wm["green"]
    elif kind == "draft" and isinstance(s.get("tree"), dict):
        tree = s["tree"]
        by_id = {n["id"]: n for n in tree_nodes(tree)}
        path = accepted_ids(tree)
        ck = tree.get("correction_kind")
        for j, r in enumerate(recs):
            if j < len(path):
                node = by_id.get(path[j], {})
                r.accept, r.prob = "accepted", num(node.get("p"))
            elif tree.get("correction") is not None and j == len(path):
                r.accept = "bonus" if ck == "bonus" else "correction"
    return recs


def token_records(trace: dict[str, Any], upto_step: int | None = None) -> list[TokenRec]:
    """The output tokens of a causal trace with the step that produced each.

    Tokens come from the steps' ``committed`` lists; for a finished trace the final
    ``output_ids`` win (a decoder may cut the output at a stop or pick a different final
    sequence, as beam search does): tokens past the agreeing prefix are credited to the
    last step.
    """
    steps = steps_of(trace)
    recs: list[TokenRec] = []
    last = -1
    for s in steps:
        i = s.get("i")
        if upto_step is not None and isinstance(i, int) and i > upto_step:
            break
        last = i if isinstance(i, int) else last
        if s.get("kind") != "denoise":
            recs.extend(_step_records(trace, s))
    out = ints(trace.get("output_ids"))
    if _is_done(trace) and (upto_step is None or (steps and upto_step >= len(steps) - 1)):
        agree = 0
        while agree < min(len(out), len(recs)) and recs[agree].id == out[agree]:
            agree += 1
        recs = recs[:agree] + [TokenRec(t, max(last, 0), token_text(trace, t)) for t in out[agree:]]
    else:
        recs += _provisional(trace, steps, upto_step, recs)
    pieces = trace.get("pieces")
    if isinstance(pieces, list) and len(pieces) == len(out):
        for pos, r in enumerate(recs):
            if pos < len(out) and r.id == out[pos] and isinstance(pieces[pos], str):
                r.text = pieces[pos]
    return recs


def _provisional(trace: dict[str, Any], steps: list[dict[str, Any]], upto_step: int | None,
                 recs: list[TokenRec]) -> list[TokenRec]:
    """While a beam search runs it commits nothing; show its best hypothesis so far,
    marked provisional, so the lane's output still grows (past what is committed)."""
    shown = [s for s in steps if upto_step is None or not isinstance(s.get("i"), int) or s["i"] <= upto_step]
    if not shown or shown[-1].get("kind") != "beam":
        return []
    beams = [b for b in (shown[-1].get("beams") or []) if isinstance(b, dict) and ints(b.get("ids"))]
    if not beams:
        return []
    best = max(beams, key=lambda b: (num(b.get("score")) is not None, num(b.get("score")) or 0.0))
    ids = ints(best.get("ids"))
    have = [r.id for r in recs]
    if ids[: len(have)] != have:
        return []
    i = shown[-1].get("i") if isinstance(shown[-1].get("i"), int) else 0
    return [TokenRec(t, i, token_text(trace, t), accept="provisional") for t in ids[len(have):]]


def canvas_records(trace: dict[str, Any], upto_step: int | None = None) -> list[TokenRec]:
    """The positions of a diffusion trace's canvas at a step (masks included)."""
    dsteps = denoise_steps(trace)
    if upto_step is not None:
        dsteps = [s for s in dsteps if not isinstance(s.get("i"), int) or s["i"] <= upto_step]
    if not dsteps:
        return []
    s = dsteps[-1]
    shown = s.get("i") if isinstance(s.get("i"), int) else 0
    canvas = canvas_of(s)
    mid = mask_id_of(trace, s)
    st = commit_state(trace, shown)
    if upto_step is None and _is_done(trace):
        out = ints(trace.get("output_ids"))
        if out and len(out) < len(canvas) and canvas[: len(out)] == out:
            canvas = canvas[: len(out)]  # the decoder cut the output (at end of text): show what it returned
    recs = []
    for p, tok in enumerate(canvas):
        if is_masked(tok, mid):
            recs.append(TokenRec(None, shown, MASK_GLYPH, masked=True))
        else:
            recs.append(TokenRec(tok, st.step.get(p, shown), token_text(trace, tok),
                                 prob=st.confidence.get(p), entropy=st.entropy.get(p)))
    return recs


def _mix(stops: list[tuple[int, int, int]], x: float, alpha: float) -> str:
    x = min(max(x, 0.0), 1.0) * (len(stops) - 1)
    k = min(int(x), len(stops) - 2)
    f = x - k
    c = [round(a + (b - a) * f) for a, b in zip(stops[k], stops[k + 1])]
    return f"rgba({c[0]},{c[1]},{c[2]},{alpha})"


def prob_strength(p: float) -> float:
    """0 for p = 1 up to 1 for p <= PROB_FLOOR, linear in log p (the colour's strength)."""
    p = min(max(p, 1e-12), 1.0)
    return min(1.0, math.log(p) / math.log(PROB_FLOOR))


def _background(metric: str, r: TokenRec, nsteps: int) -> str:
    if metric == "probability" and r.prob is not None:
        return f"rgba(229,72,77,{0.06 + 0.64 * prob_strength(r.prob):.3f})"
    if metric == "entropy" and r.entropy is not None:
        return f"rgba(139,92,246,{0.08 + 0.62 * min(max(r.entropy, 0) / ENTROPY_MAX, 1):.3f})"
    if metric == "acceptance":
        return _ACCEPT_BG.get(r.accept, "")
    if metric == "unmask_step":
        return _mix(_STEP_STOPS, r.step / max(nsteps - 1, 1), 0.45)
    if metric == "watermark" and r.green is not None:
        return GREEN_BG if r.green else RED_BG
    return ""


def _title(r: TokenRec, diffusion: bool) -> str:
    parts = [f"step {r.step}"]
    if r.masked:
        return f"masked (canvas at step {r.step})"
    parts.append(f"“{visible(r.text)}” #{r.id}")
    if r.prob is not None:
        parts.append(f"{'confidence' if diffusion else 'p'} {r.prob:.3f}")
    if r.final is not None and r.prob is not None and abs(r.final - r.prob) > 1e-6:
        parts.append(f"final p {r.final:.3f}")
    if r.entropy is not None:
        parts.append(f"entropy {r.entropy:.2f} nats")
    if r.green is not None:
        parts.append("watermark: green" if r.green else "watermark: red")
    if not diffusion and r.accept != "target":
        parts.append(_ACCEPT_LABEL.get(r.accept, r.accept))
    return " · ".join(parts)


def tokens_html(trace: dict[str, Any], metric: str, lane: int = 0, upto_step: int | None = None) -> str:
    """The output of one lane as HTML, tokens coloured by ``metric``.

    ``metric`` is one of probability, entropy, acceptance, unmask_step, watermark, none (anything
    else counts as none). Diffusion traces render the canvas of the last (or
    ``upto_step``) denoise step with masks visible. ``upto_step`` limits the output to
    what steps up to that index produced and outlines that step's tokens.
    """
    metric = metric if metric in METRICS else "none"
    lane_s = html.escape(str(lane))
    if not isinstance(trace, dict):
        trace = {}
    diffusion = bool(denoise_steps(trace))
    recs = canvas_records(trace, upto_step) if diffusion else token_records(trace, upto_step)
    nsteps = len(steps_of(trace))
    wrap = (f'<div class="tok-output" data-lane="{lane_s}" data-metric="{metric}" '
            f'style="white-space:pre-wrap;word-break:break-word;line-height:1.75">')
    if not recs:
        return wrap + '<span class="tok-empty" style="opacity:0.6">(no tokens yet)</span></div>'
    parts = []
    for pos, r in enumerate(recs):
        cls = "tok mask" if r.masked else "tok"
        style = []
        bg = "rgba(154,161,171,0.28)" if r.masked else _background(metric, r, nsteps)
        if bg:
            style.append(f"background:{bg}")
        if r.masked:
            style.append("color:#9aa1ab")
        if r.accept == "provisional":
            cls += " prov"
            style.append("opacity:0.6;font-style:italic")
        if upto_step is not None and r.step == upto_step and not r.masked:
            cls += " cur"
            style.append("outline:1.5px solid #f5a524")
        style.append("border-radius:3px;cursor:pointer")
        text = html.escape(r.text) if r.masked else html_token(r.text)
        # a canvas cell names its position, so a click on a mask can pick it (a hand on the canvas)
        at = f' data-pos="{pos}"' if diffusion else ""
        parts.append(f'<span class="{cls}" data-lane="{lane_s}" data-step="{int(r.step)}"{at} '
                     f'title="{html.escape(_title(r, diffusion))}" style="{";".join(style)}">'
                     f'{text}</span>')
    return wrap + "".join(parts) + "</div>"


def legend_html(metric: str) -> str:
    """A one-line legend for the colouring of :func:`tokens_html`."""
    def swatch(bg: str, text: str) -> str:
        return (f'<span style="display:inline-flex;align-items:center;gap:4px;margin-right:12px">'
                f'<span style="display:inline-block;width:14px;height:14px;border-radius:3px;'
                f'background:{bg}"></span>{html.escape(text)}</span>')

    def ramp(css: str, lo: str, hi: str, what: str) -> str:
        return (f'<span style="display:inline-flex;align-items:center;gap:6px">{html.escape(lo)}'
                f'<span style="display:inline-block;width:90px;height:12px;border-radius:3px;background:{css}">'
                f'</span>{html.escape(hi)}</span><span style="margin-left:10px;opacity:0.75">{html.escape(what)}</span>')

    if metric == "probability":
        stops = ",".join(f"rgba(229,72,77,{0.06 + 0.64 * x / 3:.3f})" for x in range(4))
        body = ramp(f"linear-gradient(90deg,{stops})", "p = 1", f"p ≤ {PROB_FLOOR:g}",
                    "probability the model gave the chosen token, on a log scale (0.1 and 0.01 at the "
                    "thirds; diffusion: confidence at commit)")
    elif metric == "entropy":
        body = ramp("linear-gradient(90deg,rgba(139,92,246,0.08),rgba(139,92,246,0.7))", "0 nats",
                    f"≥ {ENTROPY_MAX:g} nats", "entropy of the model's distribution at that token")
    elif metric == "acceptance":
        body = "".join(swatch(_ACCEPT_BG[k] or "transparent;border:1px solid rgba(128,128,128,0.5)", _ACCEPT_LABEL[k])
                       for k in ("accepted", "correction", "bonus", "small", "target"))
    elif metric == "watermark":
        body = (swatch(GREEN_BG, "in its green list") + swatch(RED_BG, "not in it")
                + '<span style="opacity:0.75">uncoloured: not scored (too little context, or no watermark)</span>')
    elif metric == "unmask_step":
        stops = ",".join(_mix(_STEP_STOPS, x / 4, 0.6) for x in range(5))
        body = ramp(f"linear-gradient(90deg,{stops})", "first step", "last step",
                    "step at which the token was committed (diffusion: unmasked)")
    else:
        body = '<span style="opacity:0.75">no colouring</span>'
    return f'<div class="tok-legend" style="font-size:0.85em;display:flex;flex-wrap:wrap;align-items:center">{body}</div>'


def stats_figures(trace: dict[str, Any]) -> dict[str, Any]:
    """The figures the stats line shows, as numbers: ``new_tokens``, ``target_forwards``,
    ``draft_forwards``, ``tokens_per_target_forward``, ``wall_s`` and, from the trace's steps by
    the definitions of :func:`playground.core.trace.step_figures`, the speculative figures with
    their counts, ``changed_tokens``/``lossy_tokens`` and ``watermark`` (so the line agrees
    with the plots live and for traces stored before a definition changed). A trace without
    steps for a figure falls back to its stored stats."""
    if not isinstance(trace, dict):
        return {}
    stats = trace.get("stats") if isinstance(trace.get("stats"), dict) else {}
    steps = steps_of(trace)
    last = steps[-1] if steps else {}

    def count(key: str) -> int:
        v = stats.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        v = last.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else 0

    n = stats.get("new_tokens")
    if not isinstance(n, int) or isinstance(n, bool):
        n = committed_count(ints(trace.get("output_ids")), steps)
    tf, df = count("target_forwards"), count("draft_forwards")
    wall = num(stats.get("wall_s"))
    out: dict[str, Any] = {"new_tokens": n, "target_forwards": tf, "draft_forwards": df,
                           "tokens_per_target_forward": round(n / tf, 4) if tf else 0.0,
                           "wall_s": wall if wall is not None else num(last.get("t"))}
    figs = step_figures(steps)
    if "acceptance_rate" not in figs and num(stats.get("acceptance_rate")) is not None:
        figs.update({k: num(stats.get(k)) for k in ("acceptance_rate", "mean_accepted_length")})
    for key in ("changed_tokens", "lossy_tokens"):
        if key not in figs and isinstance(stats.get(key), int):
            figs[key] = stats[key]
    if "watermark" not in figs and isinstance(stats.get("watermark"), dict):
        figs["watermark"] = stats["watermark"]
    out.update(figs)
    return out


def stats_line(trace: dict[str, Any]) -> str:
    """tokens · target forwards · tokens/forward · acceptance · mean accepted length · changed
    tokens · watermark z · time · tokens/s (escaped text), the figures of
    :func:`stats_figures`."""
    if not isinstance(trace, dict):
        return ""
    stats = trace.get("stats") if isinstance(trace.get("stats"), dict) else {}
    f = stats_figures(trace)
    n, tf, df, wall = f["new_tokens"], f["target_forwards"], f["draft_forwards"], f["wall_s"]
    parts = [f"{n} {FIGURE_NAMES['new_tokens']}", f"{tf} target forwards" + (f" (+{df} draft)" if df else "")]
    if tf:
        parts.append(f"{f['tokens_per_target_forward']:.2f} {FIGURE_NAMES['tokens_per_target_forward']}")
    spec = "acceptance_rate" in f
    if spec:
        parts.append(f"{FIGURE_NAMES['acceptance_rate']} {100 * (f['acceptance_rate'] or 0.0):.0f}%")
        if f.get("mean_accepted_length") is not None:
            parts.append(f"{FIGURE_NAMES['mean_accepted_length']} {f['mean_accepted_length']:.2f}")
    for key in ("changed_tokens", "lossy_tokens"):
        if isinstance(f.get(key), int):
            parts.append(f"{f[key]} {FIGURE_NAMES[key]}")
    wm = f.get("watermark")
    if isinstance(wm, dict) and num(wm.get("z")) is not None and isinstance(wm.get("scored"), int):
        parts.append(f"{FIGURE_NAMES['watermark_z']} {wm['z']:.2f} ({wm.get('green')}/{wm['scored']} green)")
    masked = stats.get("masked_positions")
    if isinstance(masked, int) and masked > 0:
        parts.append(f"{masked} positions still masked")
    if wall is not None:
        parts.append(f"{wall:.2f} s")
        if wall > 0 and n:
            parts.append(f"{n / wall:.1f} tokens/s")
    reason = stats.get("finish_reason")
    if reason:
        parts.append(f"finished: {reason}")
    if stats.get("constraint_complete") is False:
        parts.append("constraint incomplete: ran out of tokens" if reason == "length"
                     else "constraint incomplete")
    if stats.get("error"):
        parts.append(f"error: {stats['error']}")
    mismatch = stats.get("lossless_mismatch")
    if isinstance(mismatch, int) and mismatch > 0:  # a lossless lane left greedy's path: say so, with the count
        parts.append(f"lossless_mismatch: {mismatch}")
    if trace.get("lossy") and spec:
        parts.append("lossy acceptance")
    return html.escape(" · ".join(str(p) for p in parts))
