"""Prompts through a tokenizer's chat template (instruct models), with an optional system prompt.

Every lane of a comparison encodes its prompt here, so chat mode and the system prompt are
applied the same way in each (a lane on another model uses that model's own template).
"""

from __future__ import annotations

from typing import Any

from playground.core.errors import PlaygroundError

SYSTEM_NEEDS_CHAT = "a system prompt needs chat mode (the model's chat template); turn chat on"


def check_chat(chat: Any, system_prompt: Any) -> tuple[bool, str | None]:
    """A request's ``(chat, system_prompt)`` checked: chat a flag, the system prompt text (blank
    is none) and only in chat mode, since without a chat template there is no system turn."""
    if chat is None:
        chat = False
    if not isinstance(chat, bool):
        raise PlaygroundError(f"chat must be true or false, got {chat!r}")
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise PlaygroundError(f"the system prompt must be text, got {type(system_prompt).__name__}")
    system_prompt = system_prompt if system_prompt and system_prompt.strip() else None
    if system_prompt and not chat:
        raise PlaygroundError(SYSTEM_NEEDS_CHAT)
    return chat, system_prompt


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def chat_messages(text: str, system_prompt: str | None = None) -> list[dict[str, str]]:
    """The conversation a chat-mode prompt stands for: an optional system turn, then the user's."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt and system_prompt.strip() else []
    return messages + [{"role": "user", "content": text}]


def chat_ids(tokenizer: Any, name: str, text: str, system_prompt: str | None = None) -> list[int]:
    """Token ids of ``text`` as a user turn in ``tokenizer``'s chat template, ready for the reply.

    A tokenizer without a template, or a template that refuses the conversation (Gemma's
    refuses a system turn), is one :class:`PlaygroundError` line.
    """
    if not has_chat_template(tokenizer):
        raise PlaygroundError(f"model {name!r} has no chat template; run without chat mode")
    try:
        ids = tokenizer.apply_chat_template(chat_messages(text, system_prompt), add_generation_prompt=True,
                                            tokenize=True)
    except Exception as e:  # noqa: BLE001 - a template's raise_exception() is a jinja TemplateError
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        what = "the system prompt" if system_prompt and system_prompt.strip() else "the prompt"
        raise PlaygroundError(f"the chat template of {name!r} refused {what}: {msg}") from None
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    if ids and isinstance(ids[0], (list, tuple)):
        ids = ids[0]
    return [int(x) for x in ids]
