"""One decoder run from request to trace: validation, context, stepping, stats.

:func:`prepare` checks a request (decoder, knobs, model kinds, draft, prompt length, hosting
limits) and returns a :class:`Run`; :meth:`Run.step` advances it by one decoder step (the
lockstep runner interleaves several runs this way) and :meth:`Run.finish` closes the trace.
:func:`run_to_end` does both for the CLI and the Python API.
"""

from __future__ import annotations

import threading
from typing import Any

from decoders.token_text import view_token
from decoders.base import Context, Decoder, get_decoder
from decoders.constraint import grammar_complete
from decoders.diffusion.hand import hand_ok, parse_hand
from playground.core.errors import Cancelled, PlaygroundError
from playground.core.models import ModelHandle, load_model, token_pieces
from playground.core.models.chat import check_chat
from playground.core.settings import limits
from playground.core.trace import (Step, Trace, TraceRecorder, acceptance_by_position, committed_count,
                              token_id_keys)
import playground.force as forcing
import playground.inputs as inputs
from playground.watch import resolve_watch


class Run:
    """A prepared decoder run that can be advanced one step at a time."""

    def __init__(self, decoder: Decoder, ctx: Context, trace: Trace) -> None:
        self.decoder, self.ctx, self.trace = decoder, ctx, trace
        self.recorder = TraceRecorder(trace, ctx.target, ctx.draft)
        self._gen = decoder.run(ctx)
        self.done = False
        self.output: list[int] = []
        self.error: str | None = None
        self._text_steps = 0  # steps whose token ids _texts already holds (streaming snapshots)
        self._texts: dict[str, str] = {}

    @property
    def target_forwards(self) -> int:
        """Target forward passes so far (measured by the model view)."""
        return self.ctx.target.forwards

    def step(self) -> Step | None:
        """Advance one step; return it, or None when the decoder has finished."""
        if self.done:
            return None
        try:
            step = next(self._gen)
        except StopIteration:
            self._close(self.decoder.finish_reason)
            return None
        except Cancelled:
            self._close("cancelled")
            return None
        except PlaygroundError as e:
            self.error = str(e)
            self._close("error")
            raise
        self.recorder.add(step)
        if step.kind != "denoise":
            self.output.extend(step.committed)
        return step

    def snapshot(self) -> dict[str, Any]:
        """The trace so far as a JSON-ready dict (with its token texts), for streaming."""
        d = self.trace.to_dict()
        if not self.done:
            # a diffusion decoder's output so far is its canvas (masks included), not a prefix
            live = self.output if self.decoder.output_override is None else self.decoder.output_override
            d["output_ids"] = list(live)
            d["text"] = self.ctx.target.decode(live)
            d["stats"] = self.live_stats()
        d["tokens"] = token_texts(self.ctx.target, d) if self.done else self._live_token_texts(d)
        d["done"] = self.done
        return d

    def _live_token_texts(self, d: dict[str, Any]) -> dict[str, str]:
        """:func:`token_texts` of a streaming snapshot, walking only the steps added since the
        last one (the page asks for a snapshot a dozen times a second, and a whole walk of
        six lanes' steps cost the decoding worker ~15 ms each time at 64 tokens). Steps are
        appended, never rewritten, while a run streams; the final snapshot walks everything."""
        steps = d.get("steps") or []
        seen, texts = self._text_steps, self._texts
        if seen > len(steps):
            seen, texts = 0, {}
        ids: set[int] = set()
        keys = token_id_keys()
        _ids_in({k: v for k, v in d.items() if k not in ("steps", "tokens")}, ids, keys)
        for st in steps[seen:]:
            _ids_in(st, ids, keys)
        for i in ids:
            if 0 <= i < 10**8 and str(i) not in texts:
                texts[str(i)] = view_token(self.ctx.target, i)
        self._text_steps, self._texts = len(steps), texts
        return dict(texts)

    def live_stats(self) -> dict[str, Any]:
        """Stats of the run so far (the final ones once it is done)."""
        if self.done:
            return dict(self.trace.stats)
        tf = self.ctx.target.forwards
        # a diffusion run's output so far is its canvas: count its committed positions
        live = self.output if self.decoder.output_override is None else self.decoder.output_override
        n = committed_count(live, self.trace.steps)
        return {"new_tokens": n, "target_forwards": tf,
                "draft_forwards": self.recorder.draft_count("forwards"),
                "tokens_per_target_forward": round(n / tf, 4) if tf else 0.0,
                "wall_s": round(self.recorder.now(), 4), "first_token_s": self.recorder.first_token_s,
                "finish_reason": None, "steps": len(self.trace.steps)}

    def cancel(self) -> None:
        """Ask the decoder to stop at its next step; what it produced is kept."""
        self.ctx.cancel.set()
        if not self.done:
            self._gen.close()
            self._close("cancelled")

    def _close(self, reason: str) -> None:
        if self.done:
            return
        self.done = True
        out = self.decoder.output_override if self.decoder.output_override is not None else self.output
        out = list(out)[: max(self.ctx.max_new_tokens, 0)] if self.decoder.kind == "causal" else list(out)
        text = self.ctx.target.decode(out)
        stats = dict(self.decoder.extra_stats)
        trees = [s.evidence["tree"] for s in self.trace.steps
                 if s.kind == "draft" and isinstance(s.evidence.get("tree"), dict)]
        if trees:
            stats["acceptance_by_position"] = acceptance_by_position(trees)
        if self.error:
            stats["error"] = self.error
        elif self.decoder.kind == "causal":
            complete = grammar_complete(self.ctx.target, self.ctx.params, out)
            if complete is not None:
                stats["constraint_complete"] = complete
        self.recorder.finish(out, text, reason, **stats)
        self.trace.extra["tokens"] = token_texts(self.ctx.target, self.trace.to_dict())
        self.trace.extra["pieces"] = token_pieces(self.ctx.target.tokenizer, out, self.trace.prompt_ids)

    def finish(self) -> Trace:
        """Run the remaining steps (if any) and return the closed trace."""
        while not self.done:
            self.step()
        return self.trace


def _ids_in(d: Any, out: set[int], keys: frozenset[str], key: str = "") -> None:
    """Collect every token id a trace dict mentions under one of ``keys`` (ids, tokens,
    canvases, trees, beams: the keys the step kinds declare, :func:`playground.core.trace.token_id_keys`)."""
    if isinstance(d, dict):
        for k, v in d.items():
            if k in keys:
                _ids_in(v, out, keys, "ids")
            elif isinstance(v, (dict, list)) and k not in ("tokens", "pieces"):
                _ids_in(v, out, keys, "")
    elif isinstance(d, list):
        for v in d:
            if key == "ids" and isinstance(v, int) and not isinstance(v, bool):
                out.add(v)
            elif isinstance(v, (dict, list)):
                _ids_in(v, out, keys, key)
    elif key == "ids" and isinstance(d, int) and not isinstance(d, bool):
        out.add(d)


def token_texts(view: Any, trace_dict: dict[str, Any]) -> dict[str, str]:
    """Display text of every token id in a trace, so a replay needs no tokenizer."""
    ids: set[int] = set()
    _ids_in(trace_dict, ids, token_id_keys())
    return {str(i): view_token(view, i) for i in sorted(ids) if 0 <= i < 10**8}


def check_prompt_text(prompt: str, system_prompt: str | None = None) -> None:
    """Reject an empty prompt, or one (with its system prompt) over the character limit, in one
    line: checked on the text, before anything loads a model or tokenises it."""
    lim = limits()
    if not prompt or not prompt.strip():
        raise PlaygroundError("the prompt is empty")
    chars = len(prompt) + len(system_prompt or "")
    if chars > lim.max_prompt_chars:
        what = "the prompt and the system prompt have" if system_prompt else "the prompt has"
        raise PlaygroundError(f"{what} {chars} characters; the limit here is {lim.max_prompt_chars}")


def check_prompt(prompt: str, prompt_ids: list[int], handle: ModelHandle, max_new_tokens: int,
                 system_prompt: str | None = None) -> None:
    """Reject an empty or too-long prompt with one clear line (a system prompt counts too)."""
    check_prompt_text(prompt, system_prompt)
    if not prompt_ids:
        raise PlaygroundError("the prompt encodes to no tokens")
    total = len(prompt_ids) + max_new_tokens
    if total > handle.context_length:
        raise PlaygroundError(
            f"prompt ({len(prompt_ids)} tokens) plus max_new_tokens ({max_new_tokens}) exceeds "
            f"the context of {handle.name!r} ({handle.context_length} tokens)")


def _check_request_types(model: Any, decoder: Any, prompt: Any, seed: Any, draft: Any, params: Any,
                         stop: Any, system_prompt: Any) -> None:
    """Refuse a request whose fields have the wrong type or size, in one line naming the field,
    before any model is loaded or any prompt tokenised (a 10 MB prompt is refused at once)."""
    lim = limits()
    if not isinstance(model, ModelHandle):
        inputs.text("model", model, 1000)
    inputs.text("decoder", decoder, 200)
    if draft is not None and not isinstance(draft, ModelHandle):
        inputs.text("draft", draft, 1000)
    inputs.text("the prompt", prompt, lim.max_prompt_chars)
    inputs.text("the system prompt", system_prompt, lim.max_prompt_chars, optional=True)
    if params is not None:
        if not isinstance(params, dict):
            raise PlaygroundError("knobs must be a JSON object of knob values")
        inputs.json_shape("knobs", params)
    if stop is not None:
        if not isinstance(stop, (list, tuple)) or len(stop) > 64:
            raise PlaygroundError("stop must be a list of at most 64 strings")
        for s in stop:
            inputs.text("a stop string", s, 1000)


def prepare(model: str | ModelHandle, decoder: str, prompt: str, max_new_tokens: int = 64,
            seed: int = 0, draft: str | ModelHandle | None = None, params: dict[str, Any] | None = None,
            stop: list[str] | None = None, chat: bool = False, top_k_evidence: int = 20,
            cancel: threading.Event | None = None, load_kwargs: dict[str, Any] | None = None,
            force: Any = None, system_prompt: str | None = None, trust_remote_code: bool = False,
            watch: Any = None, hand: Any = None) -> Run:
    """Validate a request and build a :class:`Run` (models loaded or taken from the LRU).

    ``chat`` encodes the prompt as a user turn in the target model's chat template (after a
    system turn holding ``system_prompt``, if given): the prompt ids every decoder and draft
    of the run start from, recorded in the trace with ``chat``/``system_prompt``. A model
    without a template, or a system prompt without chat, is one :class:`PlaygroundError` line.
    ``trust_remote_code`` lets the model repository's own code run (LLaDA, Dream), where the
    host allows it (:func:`playground.hosting.remote_code_allowed`); same as
    ``load_kwargs={"trust_remote_code": True}``.

    ``force``: ``[[position, token_id], ...]`` tokens the run must emit (a branch; see
    ``playground/force.py``). ``watch``: words or token ids whose probability every token step
    records (``playground/watch.py``); the resolved list is the trace's ``watch``. ``hand``:
    ``{"step": S, "commit": [[position, token_id], ...]}``, a reader's commits at step S of a
    diffusion run (a canvas branch; ``decoders/diffusion/hand.py``), kept as the trace's ``hand``."""
    _check_request_types(model, decoder, prompt, seed, draft, params, stop, system_prompt)
    check_prompt_text(prompt, system_prompt)
    seed = inputs.seed(seed)
    cls = get_decoder(decoder)
    forced = forcing.parse_force(force)
    force_mode = forcing.force_mode(cls) if forced else ""
    hand_at = parse_hand(hand)
    if hand_at is not None:
        hand_ok(cls)
    knobs = cls.params.validate(decoder, params or {})
    lim = limits()
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool):
        raise PlaygroundError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
    if max_new_tokens < 1:
        raise PlaygroundError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if max_new_tokens > lim.max_new_tokens:
        raise PlaygroundError(f"max_new_tokens={max_new_tokens} is over this instance's limit of {lim.max_new_tokens}")
    chat, system_prompt = check_chat(chat, system_prompt)
    lk = dict(load_kwargs or {})
    if not isinstance(trust_remote_code, bool):
        raise PlaygroundError(f"trust_remote_code must be true or false, got {trust_remote_code!r}")
    if trust_remote_code:
        lk["trust_remote_code"] = True
    # Stop may come while a model loads: the wait ends at once (the load finishes in the background).
    cancel = cancel or threading.Event()
    # The kind is checked from the config, before any weights are read.
    handle = model if isinstance(model, ModelHandle) else load_model(model, **{"kind": cls.kind, **lk}, cancel=cancel)
    if handle.kind != cls.kind:
        raise PlaygroundError(f"decoder {decoder!r} needs a {cls.kind} model, but {handle.name!r} is a {handle.kind} model")
    draft_handle: ModelHandle | None = None
    if cls.needs_draft:
        if draft is None:
            raise PlaygroundError(f"decoder {decoder!r} needs a draft model (--draft)")
        draft_handle = draft if isinstance(draft, ModelHandle) else load_model(draft, **lk, cancel=cancel)
        # Most drafts are causal; a decoder may ask for another kind (diffuspec drafts with a diffusion LM).
        want = getattr(cls, "draft_kind", "causal")
        if draft_handle.kind != want:
            raise PlaygroundError(f"draft model {draft_handle.name!r} is a {draft_handle.kind} model; "
                                  f"a draft must be {want}" + ("" if want == "causal" else f" for {decoder!r}"))
        if not same_tokenizer(handle, draft_handle):
            raise PlaygroundError(f"draft model {draft_handle.name!r} has a different tokenizer from {handle.name!r}")
    watched = resolve_watch(handle, watch)
    prompt_ids = handle.encode(prompt, chat=chat, system_prompt=system_prompt) if prompt and prompt.strip() else []
    check_prompt(prompt, prompt_ids, handle, max_new_tokens, system_prompt)
    target_view = handle.view()
    draft_view = draft_handle.view() if draft_handle is not None else None
    stop_ids = set(handle.eos_ids)
    ctx = Context(target=target_view, draft=draft_view, prompt_ids=prompt_ids,
                  max_new_tokens=max_new_tokens, params=knobs, seed=int(seed),
                  stop_ids=stop_ids, stop_strings=list(stop or []), top_k_evidence=top_k_evidence,
                  cancel=cancel, watch=tuple(e["token"] for e in watched), hand=hand_at)
    inst = cls()
    trace = Trace(model=handle.name, decoder=decoder, params=knobs, seed=int(seed), prompt=prompt,
                  prompt_ids=prompt_ids)
    if draft_handle is not None:
        trace.extra["draft"] = draft_handle.name
    if watched:
        trace.extra["watch"] = watched
    if chat:
        trace.extra["chat"] = True
        if system_prompt:
            trace.extra["system_prompt"] = system_prompt
    if inst.is_lossy(knobs):
        trace.extra["lossy"] = True
    if hand_at is not None:
        trace.extra["hand"] = hand_at.as_dict()
    return forcing.attach(Run(inst, ctx, trace), forced, force_mode)


def same_tokenizer(a: ModelHandle, b: ModelHandle) -> bool:
    """Whether two models share a vocabulary (same size and same token strings)."""
    if a.tokenizer is b.tokenizer:
        return True
    try:
        return _vocab(a) == _vocab(b)
    except Exception:  # noqa: BLE001
        return False


def _vocab(model: Any) -> dict[str, int]:
    """A model's token table: the handle's copy read once, else the tokenizer's."""
    table = getattr(model, "vocab", None)
    return table if isinstance(table, dict) else model.tokenizer.get_vocab()


def run_to_end(**request: Any) -> Trace:
    """Prepare and run one decoder to the end; return its trace."""
    return prepare(**request).finish()
