"""Chat mode: the prompt through the model's chat template, with a system prompt, the same in
every lane and every front door (engine, Python API, CLI); every misuse is one line."""

from __future__ import annotations

import copy
import json

import pytest

from playground import api
from playground.cli import main
from playground.engine import prepare
from playground.core.errors import PlaygroundError

TEMPLATE = ("{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}ASSISTANT:{% endif %}")
# like Gemma's: no system turn allowed
NO_SYSTEM = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
             "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<model>")


@pytest.fixture(scope="module")
def chat_tokenizer(tokenizer):
    t = copy.deepcopy(tokenizer)
    t.chat_template = TEMPLATE
    return t


@pytest.fixture(scope="module")
def chat_handle(llama_handle, chat_tokenizer):
    from playground.core.models import handle_from_model

    return handle_from_model(llama_handle.model, chat_tokenizer, name="tiny-chat")


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory, chat_tokenizer):
    """A tiny Llama with a chat template, saved as a local model directory."""
    from conftest import build_llama

    d = tmp_path_factory.mktemp("chat-llama")
    build_llama(chat_tokenizer).save_pretrained(d)
    chat_tokenizer.save_pretrained(d)
    return str(d)


def test_chat_prompt_is_the_template_with_the_system_turn(chat_handle):
    run = prepare(chat_handle, "greedy", "hello there", max_new_tokens=3, chat=True, system_prompt="Be brief.")
    assert chat_handle.decode(run.trace.prompt_ids) == "SYSTEM: Be brief.\nUSER: hello there\nASSISTANT:"
    trace = run.finish().to_dict()
    assert trace["chat"] is True and trace["system_prompt"] == "Be brief."
    assert trace["prompt"] == "hello there"  # the user's text; the ids hold the template
    # without a system prompt there is no system turn; a blank one counts as none
    for system in (None, "  "):
        ids = prepare(chat_handle, "greedy", "hello there", max_new_tokens=3, chat=True,
                      system_prompt=system).trace.prompt_ids
        assert chat_handle.decode(ids) == "USER: hello there\nASSISTANT:"
    plain = prepare(chat_handle, "greedy", "hello there", max_new_tokens=3)
    assert chat_handle.decode(plain.trace.prompt_ids) == "hello there" and "chat" not in plain.trace.extra


def test_every_lane_starts_from_the_same_chat_prompt(chat_dir):
    lanes = [{"decoder": "greedy"}, {"decoder": "top_p", "knobs": {"p": 0.9}},
             {"decoder": "speculative", "draft": chat_dir}, {"decoder": "beam"}]
    traces = api.compare(lanes=lanes, model=chat_dir, prompt="wherefore", max_new_tokens=4, chat=True,
                         system_prompt="Speak in verse.")
    from transformers import AutoTokenizer

    expected = AutoTokenizer.from_pretrained(chat_dir).apply_chat_template(
        [{"role": "system", "content": "Speak in verse."}, {"role": "user", "content": "wherefore"}],
        add_generation_prompt=True, tokenize=True, return_dict=False)
    assert [t["prompt_ids"] for t in traces] == [list(expected)] * len(lanes)
    assert all(t["chat"] is True and t["system_prompt"] == "Speak in verse." for t in traces)
    plan = api.plan_compare(lanes=lanes, model=chat_dir, prompt="x", chat=True, system_prompt="S")
    assert {(r["chat"], r["system_prompt"]) for r in plan.requests()} == {(True, "S")}


def test_python_api_generate_takes_chat_and_system_prompt(chat_dir):
    trace = api.generate(model=chat_dir, decoder="greedy", prompt="hi", max_new_tokens=2, chat=True,
                         system_prompt="Be kind.")
    assert trace["chat"] is True and trace["tokens"]  # token texts cover the templated prompt too
    text = "".join(trace["tokens"][str(i)] for i in trace["prompt_ids"])
    assert text == "SYSTEM: Be kind.\nUSER: hi\nASSISTANT:"


def test_chat_on_a_model_without_a_template_is_one_line(llama_handle):
    with pytest.raises(PlaygroundError, match=r"^model 'tiny-llama' has no chat template; run without chat mode$"):
        prepare(llama_handle, "greedy", "hello", max_new_tokens=2, chat=True)


@pytest.mark.parametrize("kwargs, message", [
    ({"system_prompt": "Be brief."}, "a system prompt needs chat mode"),
    ({"chat": "yes"}, "chat must be true or false, got 'yes'"),
    ({"chat": True, "system_prompt": 3}, "the system prompt must be text, got a number"),
    ({"trust_remote_code": "1"}, "trust_remote_code must be true or false"),
])
def test_bad_chat_requests_are_one_line(chat_handle, kwargs, message):
    with pytest.raises(PlaygroundError) as err:
        prepare(chat_handle, "greedy", "hello", max_new_tokens=2, **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_template_that_refuses_the_system_turn_is_one_line(llama_handle, tokenizer):
    from playground.core.models import handle_from_model

    t = copy.deepcopy(tokenizer)
    t.chat_template = NO_SYSTEM
    h = handle_from_model(llama_handle.model, t, name="no-system")
    assert h.decode(h.encode("hi", chat=True)) == "<user>hi<model>"
    with pytest.raises(PlaygroundError, match=r"^the chat template of 'no-system' refused the system prompt: "
                                              r"System role not supported$"):
        prepare(h, "greedy", "hi", max_new_tokens=2, chat=True, system_prompt="Be brief.")


def test_system_prompt_counts_towards_the_prompt_limit(monkeypatch, chat_handle):
    monkeypatch.setenv("PLAYGROUND_MAX_PROMPT_CHARS", "12")
    prepare(chat_handle, "greedy", "hello", max_new_tokens=2, chat=True, system_prompt="Be kind")
    with pytest.raises(PlaygroundError, match=r"^the prompt and the system prompt have 14 characters; "
                                              r"the limit here is 12$"):
        prepare(chat_handle, "greedy", "hello", max_new_tokens=2, chat=True, system_prompt="Be brief.")


def test_cli_generate_and_compare_in_chat_mode(capsys, chat_dir):
    code = main(["generate", "--model", chat_dir, "--prompt", "hi", "--max-new-tokens", "2", "--chat",
                 "--system-prompt", "Be kind.", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    trace = json.loads(out)
    assert trace["chat"] is True and trace["system_prompt"] == "Be kind."
    code = main(["compare", "--preset", "greedy-beam-sampling", "--model", chat_dir, "--prompt", "hi",
                 "--max-new-tokens", "2", "--chat", "--system-prompt", "Be kind.", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    lanes = json.loads(out)
    assert len(lanes) == 3 and {tuple(t["prompt_ids"]) for t in lanes} == {tuple(trace["prompt_ids"])}


@pytest.mark.parametrize("argv, needle", [
    (["--system-prompt", "Be kind."], "a system prompt needs chat mode"),
    (["--chat"], "has no chat template"),
])
def test_cli_chat_mistakes_are_one_line(capsys, tmp_path, tokenizer, argv, needle):
    from conftest import build_llama

    build_llama(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    code = main(["generate", "--model", str(tmp_path), "--prompt", "hi", "--max-new-tokens", "2", *argv])
    _, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err


def test_a_diffusion_lane_gets_the_same_chat_prompt(chat_tokenizer, chat_handle):
    from transformers import BertConfig, BertForMaskedLM

    from playground.core.models import handle_from_model

    cfg = BertConfig(vocab_size=len(chat_tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    mlm = handle_from_model(BertForMaskedLM(cfg), chat_tokenizer, name="tiny-mlm-chat")
    causal = prepare(chat_handle, "greedy", "hi", max_new_tokens=4, chat=True, system_prompt="S.")
    diffusion = prepare(mlm, "llada", "hi", max_new_tokens=4, chat=True, system_prompt="S.")
    assert diffusion.trace.prompt_ids == causal.trace.prompt_ids
    trace = diffusion.finish()
    assert trace.prompt_ids == causal.trace.prompt_ids and trace.extra["chat"] is True
