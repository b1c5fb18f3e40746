"""One decoder run from request to trace: validation, context, stepping, stats.

:func:`prepare` checks a request (decoder, knobs, model kinds, draft, prompt length, hosting
limits) and returns a :class:`Run`; :meth:`Run.step` advances it by one decoder step (the
lockstep runner interleaves several runs this way) and :meth:`Run.finish` closes the trace.
:func:`run_to_end` does both for the CLI and the Python API.
"""

from __future__ import annotations

import threading
from typing import Any

from decoders.base import Context, Decoder, get_decoder
from playground.errors import Cancelled, PlaygroundError
from playground.models import ModelHandle, load_model
from playground.settings import limits
from playground.trace import Step, Trace, TraceRecorder


class Run:
    """A prepared decoder run that can be advanced one step at a time."""

    def __init__(self, decoder: Decoder, ctx: Context, trace: Trace) -> None:
        self.decoder, self.ctx, self.trace = decoder, ctx, trace
        self.recorder = TraceRecorder(trace, ctx.target, ctx.draft)
        self._gen = decoder.run(ctx)
        self.done = False
        self.output: list[int] = []
        self.error: str | None = None

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
        if self.error:
            stats["error"] = self.error
        self.recorder.finish(out, text, reason, **stats)

    def finish(self) -> Trace:
        """Run the remaining steps (if any) and return the closed trace."""
        while not self.done:
            self.step()
        return self.trace


def check_prompt(prompt: str, prompt_ids: list[int], handle: ModelHandle, max_new_tokens: int) -> None:
    """Reject an empty or too-long prompt with one clear line."""
    lim = limits()
    if not prompt or not prompt.strip():
        raise PlaygroundError("the prompt is empty")
    if len(prompt) > lim.max_prompt_chars:
        raise PlaygroundError(f"the prompt has {len(prompt)} characters; the limit here is {lim.max_prompt_chars}")
    if not prompt_ids:
        raise PlaygroundError("the prompt encodes to no tokens")
    total = len(prompt_ids) + max_new_tokens
    if total > handle.context_length:
        raise PlaygroundError(
            f"prompt ({len(prompt_ids)} tokens) plus max_new_tokens ({max_new_tokens}) exceeds "
            f"the context of {handle.name!r} ({handle.context_length} tokens)")


def prepare(model: str | ModelHandle, decoder: str, prompt: str, max_new_tokens: int = 64,
            seed: int = 0, draft: str | ModelHandle | None = None, params: dict[str, Any] | None = None,
            stop: list[str] | None = None, chat: bool = False, top_k_evidence: int = 20,
            cancel: threading.Event | None = None, load_kwargs: dict[str, Any] | None = None) -> Run:
    """Validate a request and build a :class:`Run` (models loaded or taken from the LRU)."""
    cls = get_decoder(decoder)
    knobs = cls.params.validate(decoder, params or {})
    lim = limits()
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool):
        raise PlaygroundError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
    if max_new_tokens < 1:
        raise PlaygroundError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if max_new_tokens > lim.max_new_tokens:
        raise PlaygroundError(f"max_new_tokens={max_new_tokens} is over this instance's limit of {lim.max_new_tokens}")
    lk = load_kwargs or {}
    handle = model if isinstance(model, ModelHandle) else load_model(model, **lk)
    if handle.kind != cls.kind:
        raise PlaygroundError(f"decoder {decoder!r} needs a {cls.kind} model, but {handle.name!r} is a {handle.kind} model")
    draft_handle: ModelHandle | None = None
    if cls.needs_draft:
        if draft is None:
            raise PlaygroundError(f"decoder {decoder!r} needs a draft model (--draft)")
        draft_handle = draft if isinstance(draft, ModelHandle) else load_model(draft, **lk)
        if draft_handle.kind != "causal":
            raise PlaygroundError(f"draft model {draft_handle.name!r} is a {draft_handle.kind} model; a draft must be causal")
        if not same_tokenizer(handle, draft_handle):
            raise PlaygroundError(f"draft model {draft_handle.name!r} has a different tokenizer from {handle.name!r}")
    prompt_ids = handle.encode(prompt, chat=chat) if prompt and prompt.strip() else []
    check_prompt(prompt, prompt_ids, handle, max_new_tokens)
    target_view = handle.view()
    draft_view = draft_handle.view() if draft_handle is not None else None
    stop_ids = set(handle.eos_ids)
    ctx = Context(target=target_view, draft=draft_view, prompt_ids=prompt_ids,
                  max_new_tokens=max_new_tokens, params=knobs, seed=int(seed),
                  stop_ids=stop_ids, stop_strings=list(stop or []), top_k_evidence=top_k_evidence,
                  cancel=cancel or threading.Event())
    inst = cls()
    trace = Trace(model=handle.name, decoder=decoder, params=knobs, seed=int(seed), prompt=prompt,
                  prompt_ids=prompt_ids)
    if draft_handle is not None:
        trace.extra["draft"] = draft_handle.name
    if inst.is_lossy(knobs):
        trace.extra["lossy"] = True
    return Run(inst, ctx, trace)


def same_tokenizer(a: ModelHandle, b: ModelHandle) -> bool:
    """Whether two models share a vocabulary (same size and same token strings)."""
    if a.tokenizer is b.tokenizer:
        return True
    try:
        return a.tokenizer.get_vocab() == b.tokenizer.get_vocab()
    except Exception:  # noqa: BLE001
        return False


def run_to_end(**request: Any) -> Trace:
    """Prepare and run one decoder to the end; return its trace."""
    return prepare(**request).finish()
