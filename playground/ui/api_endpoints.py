"""The app's public API: a few ``gradio_client`` endpoints with named parameters and JSON results.

The page's own events are UI plumbing (dozens of positional values in, HTML and plot updates
out), so :func:`hide_ui_events` makes them private and only these stay in ``view_api``:

- ``/generate``: one decoder → its trace (``playground generate --json``);
- ``/compare``: a preset and/or lanes, raced in lockstep as on the page → ``{"traces",
  "session_id", "share_link"}`` (saved to the session store, as the page saves its runs);
- ``/compare_stream``: the same race, yielding ``{"traces", "done", ...}`` snapshots at the
  rate the page gets them; the last one is what ``/compare`` returns;
- ``/session``: a stored session in the export format (``playground sessions export``);
- ``/decoders``: the registry (``playground list-decoders --json``).

The contract is the Python API's (:mod:`playground.api`, which holds the shared request
handling); the hosting limits are the engine's and the settings'. A
:class:`~playground.core.errors.PlaygroundError` reaches the client as one line (``gr.Error``);
the model-running endpoints share the page's model concurrency group and run under
``hosting.gpu`` like the page's Run.

No ``from __future__ import annotations`` here: Gradio reads the return annotations to
describe the endpoints, and it does not resolve strings.
"""

import contextlib
import logging
from typing import Any, Callable, Iterator

import gradio as gr
from gradio import route_utils

import playground.ui.rules as st
from playground import api, blind, inputs
from playground.core.errors import PlaygroundError
from playground.core.settings import limits
from playground.engine import prepare
from playground.hosting import gpu, model_event_settings
from playground.runner import Runner
from playground.store import default_store
from playground.ui.rules import share_url


log = logging.getLogger(__name__)

ENDPOINTS = ("generate", "compare", "compare_stream", "session", "decoders")
STREAM_RATE = 10.0  # snapshots per second: the page's rate


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Turn a :class:`PlaygroundError` into ``gr.Error`` (the client's error message), and a
    bug into one line too (its traceback goes to the server log, not to the client)."""
    try:
        yield
    except PlaygroundError as e:
        raise gr.Error(str(e), print_exception=False) from None
    except gr.Error:
        raise
    except Exception as e:  # noqa: BLE001 - a bug must not hand the client a traceback
        log.exception("API call failed")
        raise gr.Error(" ".join(f"internal error: {type(e).__name__}: {e}".split())[:300],
                       print_exception=False) from None


def check_text_fields(**fields: Any) -> None:
    """Each field is text or absent, within its size limit: one line naming the first that is
    not ("prompt must be text, got a list"), before anything else is done with the request."""
    caps = {"prompt": limits().max_prompt_chars}
    words = {"prompt": "the prompt"}  # as the engine says it: "the prompt has 5000 characters; ..."
    for name, value in fields.items():
        inputs.text(words.get(name, name), value, caps.get(name, 1000), optional=True)


# ---------------------------------------------------------------------- endpoints
def generate(model: str = api.DEFAULT_MODEL, decoder: str = "greedy", prompt: str = "",
             max_new_tokens: int = api.DEFAULT_MAX_NEW_TOKENS, seed: int = 0, draft: str | None = None,
             knobs: dict[str, Any] | str | None = None) -> dict[str, Any]:
    """Run one decoder on a prompt and return its trace (as `playground generate --json` prints it).

    Parameters:
        model: a bundled model name (tiny-shakespeare, ...) or another model this instance allows
        decoder: a decoder name (see /decoders)
        prompt: the prompt text
        max_new_tokens: most tokens to generate
        seed: the random seed (the same seed gives every sampler the same random numbers)
        draft: the draft model, for decoders that need one (speculative, ...)
        knobs: the decoder's knobs as a JSON object, e.g. {"p": 0.9}
    """
    with one_line_errors():
        check_text_fields(model=model, decoder=decoder, prompt=prompt, draft=draft)
        return _generate_on_gpu(model=model, decoder=decoder, prompt=prompt,
                                max_new_tokens=api.whole_number("max_new_tokens", max_new_tokens),
                                seed=api.whole_number("seed", seed), draft=draft or None,
                                params=api.knob_dict("knobs", knobs))


# One parameter list for /compare and /compare_stream (Gradio reads it from each docstring).
COMPARE_PARAMETERS = """
    Parameters:
        preset: a preset name (playground list-presets); it gives the lanes, model, prompt, seed and length
        lanes: a JSON list of lanes [{"decoder", "knobs", "draft", "model"}], replacing the preset's
        prompt: the prompt text (default: the preset's)
        model: the model of every lane without its own (default: the preset's, else tiny-shakespeare)
        seed: the random seed (default: the preset's, else 0)
        max_new_tokens: most tokens per lane (default: the preset's, else 64)
        policy: who steps next: forwards (equal target forwards, the default), cost (equal cost),
            wall (equal wall time), steps (equal steps) or free (round robin)
"""


def race_parameters(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Give the race endpoint ``fn`` the race's parameter list, after its own description."""
    fn.__doc__ = (fn.__doc__ or "").rstrip() + "\n" + COMPARE_PARAMETERS
    return fn


@race_parameters
def compare(preset: str | None = None, lanes: list[Any] | str | None = None, prompt: str | None = None,
            model: str | None = None, seed: int | None = None, max_new_tokens: int | None = None,
            policy: str | None = None, request: gr.Request = None) -> dict[str, Any]:
    """Race several decoders on one prompt in lockstep, as the Compare page does, and save the session.

    Returns {"traces": [trace per lane], "done": true, "session_id", "share_link"} (the id and
    link are null when the session could not be saved).

    """
    frame: dict[str, Any] = {}
    for frame in _comparison(preset, lanes, prompt, model, seed, max_new_tokens, policy, request, stream=False):
        pass
    return frame


@race_parameters
def compare_stream(preset: str | None = None, lanes: list[Any] | str | None = None, prompt: str | None = None,
                   model: str | None = None, seed: int | None = None, max_new_tokens: int | None = None,
                   policy: str | None = None, request: gr.Request = None) -> Iterator[dict[str, Any]]:
    """The /compare race, streamed: snapshots {"traces", "done": false} as the lanes advance, then the final /compare result.

    """
    yield from _comparison(preset, lanes, prompt, model, seed, max_new_tokens, policy, request, stream=True)


def session(session_id: str) -> dict[str, Any]:
    """A stored session in the export format (what `playground sessions export ID` writes).

    Parameters:
        session_id: the id from /compare or from a share link (?session=<id>)
    """
    with one_line_errors():
        sid = inputs.text("session_id", session_id, 200).strip()
        blind.check_readable(default_store(), sid, None)  # a blind vote's lanes are read on its vote page
        return default_store().export_session(sid)


def decoders(family: str | None = None) -> list[dict[str, Any]]:
    """Every decoder with its family, kind, flags and knobs (defaults, ranges, help): `playground list-decoders --json`.

    Parameters:
        family: only this family (sampling, search, speculative, diffusion, ...)
    """
    with one_line_errors():
        return api.list_decoders(inputs.text("family", family, 100, optional=True) or None)


# ---------------------------------------------------------------------- the model work
def _generate_impl(**request: Any) -> dict[str, Any]:
    return prepare(**request).finish().to_dict()


def _race_impl(plan: api.ComparePlan, stream: bool) -> Iterator[tuple[bool, list[dict[str, Any]]]]:
    """Prepare every lane (refusing the whole race if one cannot run) and run them in
    lockstep; yields (final, snapshots): streamed frames, then the final one."""
    runner = Runner(api.prepare_lanes(plan), policy=plan.policy, rate=STREAM_RATE)
    try:
        if not stream:
            yield True, runner.run_to_end()
            return
        final: list[dict[str, Any]] = []
        for snaps in runner.stream():
            if runner.done:
                final = snaps  # the runner ends with a full frame once every lane is done
            else:
                yield False, snaps
        yield True, final or runner.snapshots()
    finally:
        runner.cancel()  # a client that went away must not leave lanes running


# ZeroGPU wants its functions decorated when the app starts, not per request.
_generate_on_gpu = gpu(_generate_impl)
_race = gpu(_race_impl)


def _comparison(preset: Any, lanes: Any, prompt: Any, model: Any, seed: Any, max_new_tokens: Any,
                policy: Any, request: Any, stream: bool) -> Iterator[dict[str, Any]]:
    with one_line_errors():
        check_text_fields(preset=preset, model=model, prompt=prompt, policy=policy)
        plan = api.plan_compare(preset or None, lanes, model=model or None, prompt=prompt, seed=seed,
                                max_new_tokens=max_new_tokens, policy=policy or None)
        traces: list[dict[str, Any]] = []
        # closing: a client that leaves mid-stream stops the lanes now, not at garbage collection
        with contextlib.closing(_race(plan, stream)) as frames:
            for final, traces in frames:
                if not final:
                    yield {"traces": traces, "done": False, "session_id": None, "share_link": None}
        sid = _save(plan, lanes not in (None, "", []), traces)
        link = _share_link(request, sid) if sid else None
        yield {"traces": traces, "done": True, "session_id": sid, "share_link": link}


def _save(plan: api.ComparePlan, own_lanes: bool, traces: list[dict[str, Any]]) -> str | None:
    """Store the comparison as the page does; None when nothing ran or it cannot be stored."""
    if not any(t.get("steps") for t in traces):
        return None
    lanes = [st.LaneConfig(decoder=lane["decoder"], params=dict(lane["params"]),
                           draft=lane["draft"] if st.needs_draft(lane["decoder"]) else None, model=lane["model"])
             for lane in plan.lanes]
    title = st.session_title(lanes, None if own_lanes else plan.title)
    settings = st.session_settings(plan.model, plan.seed, plan.max_new_tokens, plan.policy, "auto", lanes,
                                   None if own_lanes else plan.preset)
    try:
        return default_store().save_session(title, plan.model, plan.prompt, settings, traces)
    except PlaygroundError as e:
        log.warning("could not save the session: %s", e)
        return None


def _share_link(request: Any, sid: str) -> str | None:
    """The page's share link for ``sid``, on the URL the client called."""
    try:
        req = request.request
        return share_url(route_utils.get_root_url(req, route_utils.get_api_call_path(req), None), sid)
    except Exception:  # noqa: BLE001 - called without an HTTP request (e.g. in-process): no link
        return None


# ---------------------------------------------------------------------- wiring
def register() -> set[int]:
    """Register the public endpoints in the open ``gr.Blocks``; returns their event ids."""
    model = model_event_settings()
    ids = set()
    for fn, settings in ((generate, model), (compare, model), (compare_stream, model), (session, {}),
                         (decoders, {})):
        dep = gr.api(fn, api_name=fn.__name__, **settings)
        ids.add(int(dep["id"]))
    return ids


def hide_ui_events(demo: gr.Blocks, public: set[int]) -> None:
    """Make every event but the ``public`` ones private: the browser still calls them, but
    they leave the API page and ``gradio_client`` (Gradio's per-event API visibility)."""
    for fn_id, fn in demo.fns.items():
        if fn_id not in public:
            fn.api_visibility = "private"
    names = sorted(str(demo.fns[i].api_name) for i in public)
    if names != sorted(ENDPOINTS):
        raise RuntimeError(f"the public API endpoints came out as {names}, not {sorted(ENDPOINTS)}")
