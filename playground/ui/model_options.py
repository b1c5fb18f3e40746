"""The Compare page's model options: the chat template, a system prompt, the remote-code opt-in.

They are page-wide and apply to every lane alike (each lane's model uses its own chat
template), as ``api.plan_compare`` and ``playground compare --chat`` do. The Run hands them
to every :class:`~playground.ui.rules.LaneConfig`, so they reach ``engine.prepare`` through
:func:`~playground.ui.rules.lane_request`, and a saved session records chat and the system
prompt (never the remote-code opt-in: a shared link must not opt its viewer in to code).

Element ids: ``#chat`` (checkbox), ``#system-prompt`` (shown while chat is on) and
``#trust-remote-code`` (only where :func:`playground.hosting.remote_code_allowed`).
Gradio is imported inside the functions that build or update controls, so the rules here
are tested without it.
"""

from __future__ import annotations

from typing import Any

from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

from playground.core.errors import PlaygroundError
from playground.core.models.chat import has_chat_template
from playground.core.models.kinds import REMOTE_CODE_TYPES
from playground.core.models.sources import local_config, local_dir, resolve
from playground.hosting import remote_code_allowed


CHAT_BASE = "Send the prompt as a user turn through each lane model's chat template (instruct models)."
CHAT_INFO = f"{CHAT_BASE} A model without one stops its lane with one line."
SYSTEM_INFO = "A system turn before the prompt, in every lane (chat template on only)."
REMOTE_CODE_WARNING = ("Runs Python code from the model's own repository on this machine (LLaDA, Dream): "
                       "tick it only for repositories you trust.")


def page_options(chat: Any = False, system_prompt: Any = None, trust_remote_code: Any = False) -> dict[str, Any]:
    """The options as the page's controls hold them, as :class:`LaneConfig` fields.

    The system prompt counts only while chat is on (its box is hidden otherwise, so text left
    in it must not refuse the run); the remote-code opt-in only where the host allows it.
    """
    # Only a real tick counts (a checkbox sends a bool): any other value in the opt-in's place,
    # e.g. a flag another input left there, must never opt in to running a model's code.
    on = chat is True
    text = system_prompt if isinstance(system_prompt, str) and system_prompt.strip() else None
    return {"chat": on, "system_prompt": text if on else None,
            "trust_remote_code": trust_remote_code is True and remote_code_allowed()}


def options_note(chat: bool, system_prompt: str | None) -> str:
    """One sentence saying how the prompt was sent, for a stored session's header ('' without chat)."""
    if not chat:
        return ""
    if system_prompt:
        return f"Chat template on, with the system prompt “{system_prompt}”."
    return "Chat template on, no system prompt."


def tick_line(spec: str) -> str:
    """The one line for a model that needs its own code while the page's opt-in is unticked."""
    return (f"model {spec!r} runs code from its own repository: tick “Allow remote code” (under the model) "
            f"if you trust it")


def needs_remote_code(spec: str | None) -> bool | None:
    """Whether the model ``spec`` names needs its repository's own code, from its local
    ``config.json`` alone (no transformers, no network); None when that cannot be told here
    (a hub id not in the cache, a path that is not a model: the loader says what is wrong).

    A config with an ``auto_map`` needs its code only when transformers has no class of its
    own for the model type; LLaDA and Dream always do.
    """
    if not spec or not str(spec).strip():
        return None
    try:
        source, location = resolve(str(spec))
    except PlaygroundError:
        return None
    config = local_config(local_dir(source, location))
    if config is None:
        return None
    mtype = str(config.get("model_type") or "").lower()
    if any(t in mtype for t in REMOTE_CODE_TYPES):
        return True
    if not config.get("auto_map"):
        return False

    return mtype not in CONFIG_MAPPING_NAMES


def check_remote_code(specs: list[str | None], trusted: bool) -> None:
    """Refuse, in one line that says to tick the opt-in, a model among ``specs`` that needs
    its own code when the page did not opt in. Only where the host allows remote code: elsewhere
    the box is absent and the loader says remote code is disabled here."""
    if trusted or not remote_code_allowed():
        return
    for spec in specs:
        if spec and needs_remote_code(spec):
            raise PlaygroundError(tick_line(spec))


def chat_template_note(handle: Any) -> str:
    """The chat checkbox's help line once the page's model is loaded: whether it has a template."""
    name = getattr(handle, "name", "the model")
    tokenizer = getattr(handle, "tokenizer", None)
    if tokenizer is None:
        return CHAT_INFO
    if has_chat_template(tokenizer):
        return f"{CHAT_BASE} ✓ {name} has a chat template."
    return f"{CHAT_BASE} ⚠ {name} has none: with chat on, its lanes stop with one line saying so."


# ---------------------------------------------------------------------- controls
def build_controls(page: Any) -> None:
    """Create the option controls on ``page`` (inside the open layout, under the model picker):
    ``page.chat``, ``page.system_prompt`` and ``page.trust_remote_code`` (None where the host
    does not allow remote code: the control is then not in the page at all)."""
    import gradio as gr  # here, not at the top: rules.py imports this module and stays Gradio-free

    with gr.Group(elem_id="model-options"):
        page.chat = gr.Checkbox(False, label="Chat template", info=CHAT_INFO, elem_id="chat")
        page.system_prompt = gr.Textbox("", label="System prompt", info=SYSTEM_INFO, lines=2, max_lines=6,
                                        elem_id="system-prompt", visible=False,
                                        placeholder="e.g. You are a concise assistant.")
        page.trust_remote_code = (gr.Checkbox(False, label="Allow remote code", info=REMOTE_CODE_WARNING,
                                              elem_id="trust-remote-code")
                                  if remote_code_allowed() else None)


def option_inputs(page: Any) -> list[Any]:
    """The controls the Run reads, in :func:`page_options`' argument order."""
    out = [page.chat, page.system_prompt]
    if getattr(page, "trust_remote_code", None) is not None:
        out.append(page.trust_remote_code)
    return out


def split_options(page: Any, tail: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The Run's inputs after the lanes, split into the model options (:func:`option_inputs`)
    and what follows them (the page's flow flag). A caller that sends fewer values than there
    are options (a handler test, a page without them) sends none: defaults apply."""
    k = len(option_inputs(page))
    if len(tail) < k:
        return (), tuple(tail)
    return tuple(tail[:k]), tuple(tail[k:])


def option_outputs(page: Any) -> list[Any]:
    """The controls a preset or a stored session sets (never the remote-code opt-in)."""
    return [page.chat, page.system_prompt]


def option_updates(page: Any, values: dict[str, Any]) -> dict[Any, Any]:
    """Updates that show a preset's or session's ``chat``/``system_prompt`` (a page without
    them turns chat off; a system prompt is replaced only where the page gives one)."""
    import gradio as gr  # lazily, as in build_controls

    on = bool(values.get("chat"))
    up: dict[Any, Any] = {page.chat: on}
    if "system_prompt" in values:
        up[page.system_prompt] = gr.update(value=values.get("system_prompt") or "", visible=on)
    else:
        up[page.system_prompt] = gr.update(visible=on)
    return up


def wire(page: Any) -> None:
    """Attach the options' own events: the system prompt box follows the chat checkbox."""
    import gradio as gr  # lazily, as in build_controls

    page.chat.change(lambda on: gr.update(visible=bool(on)), [page.chat], [page.system_prompt],
                     queue=False, show_progress="hidden")
