"""Tiny random models of the architectures people load, built from config (no downloads).

Every causal builder makes a 3-layer model over the shared test tokenizer (or a padded
vocabulary), with a sharpened LM head so that the argmax is well defined; ``draft=True``
makes a 1-layer model of the same architecture (another seed) to serve as a draft. The
sliding window, where the architecture has one, is smaller than the prompts the tests use,
so rolling back and tree-verifying across the window edge is exercised.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

WINDOW = 8  # sliding window of the windowed models: shorter than every matrix prompt
HIDDEN = 32
HEADS = 4

CausalSpec = tuple[str, str, Callable[[int, int], dict[str, Any]]]


def _common(vocab: int, layers: int, tok: Any) -> dict[str, Any]:
    return dict(vocab_size=vocab, num_hidden_layers=layers, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id, bos_token_id=tok.eos_token_id)


def _llama_like(vocab: int, layers: int, tok: Any, **extra: Any) -> dict[str, Any]:
    return dict(_common(vocab, layers, tok), hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=256,
                tie_word_embeddings=False, **extra)


def _configs(vocab: int, layers: int, tok: Any) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """name -> (config class, model class, config kwargs)."""
    ll = _llama_like(vocab, layers, tok)
    window = dict(sliding_window=WINDOW)
    return {
        "llama": ("LlamaConfig", "LlamaForCausalLM", ll),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", ll),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(ll, head_dim=HIDDEN // HEADS)),
        "mistral": ("MistralConfig", "MistralForCausalLM", dict(ll, sliding_window=None)),
        "mistral-window": ("MistralConfig", "MistralForCausalLM", dict(ll, **window)),
        # Gemma-2/3: sliding and global layers alternate (a hybrid cache)
        "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
                   dict(ll, head_dim=HIDDEN // HEADS, query_pre_attn_scalar=HIDDEN // HEADS, **window)),
        "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                   dict(ll, head_dim=HIDDEN // HEADS, query_pre_attn_scalar=HIDDEN // HEADS,
                        sliding_window_pattern=2, **window)),
        "phi3": ("Phi3Config", "Phi3ForCausalLM", ll),
        "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", ll),
        "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", ll),
        "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                     dict(_common(vocab, layers, tok), hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                          num_attention_heads=HEADS, max_position_embeddings=256, tie_word_embeddings=False)),
        "gpt2": ("GPT2Config", "GPT2LMHeadModel",
                 dict(vocab_size=vocab, n_layer=layers, n_embd=HIDDEN, n_head=HEADS, n_positions=256,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=False)),
        "opt": ("OPTConfig", "OPTForCausalLM",
                dict(_common(vocab, layers, tok), hidden_size=HIDDEN, ffn_dim=2 * HIDDEN,
                     num_attention_heads=HEADS, word_embed_proj_dim=HIDDEN, max_position_embeddings=256,
                     tie_word_embeddings=False)),
        "falcon": ("FalconConfig", "FalconForCausalLM",
                   dict(_common(vocab, layers, tok), hidden_size=HIDDEN, num_attention_heads=HEADS,
                        new_decoder_architecture=False, multi_query=True, alibi=False,
                        max_position_embeddings=256, tie_word_embeddings=False)),
        "gptj": ("GPTJConfig", "GPTJForCausalLM",
                 dict(vocab_size=vocab, n_layer=layers, n_embd=HIDDEN, n_head=HEADS, rotary_dim=HIDDEN // HEADS,
                      n_positions=256, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=False)),
        "mamba": ("MambaConfig", "MambaForCausalLM",
                  dict(_common(vocab, layers, tok), hidden_size=HIDDEN, state_size=4, expand=2, conv_kernel=4,
                       tie_word_embeddings=False)),
    }


CAUSAL = ("llama", "qwen2", "qwen3", "mistral", "mistral-window", "gemma2", "gemma3", "phi3", "gpt_neox",
          "gpt2", "opt", "falcon", "olmo2", "smollm3", "gptj", "mamba")
WINDOWED = ("mistral-window", "gemma2", "gemma3")
RECURRENT = ("mamba",)
MASKED = ("bert", "roberta", "distilbert", "modernbert")


def _sharpen(model: torch.nn.Module, tokens: int) -> None:
    """Random init gives near-uniform distributions: sharpen the head so the argmax is clear.
    Rows past the tokenizer's ``tokens`` (a padded vocabulary) are zero, as in real checkpoints."""
    head = model.get_output_embeddings()
    with torch.no_grad():
        head.weight.mul_(6.0)
        head.weight[tokens:] = 0.0
        if getattr(head, "bias", None) is not None:
            head.bias.zero_()


def build_causal(name: str, tok: Any, draft: bool = False, vocab: int | None = None, seed: int = 0) -> torch.nn.Module:
    """A tiny random causal LM of architecture ``name`` (3 layers; a draft has 1)."""
    import transformers

    cfg_name, model_name, kw = _configs(vocab or len(tok), 1 if draft else 3, tok)[name]
    torch.manual_seed(seed + (101 if draft else 0))
    cfg = getattr(transformers, cfg_name)(**kw)
    cfg._attn_implementation = "sdpa" if "sdpa" in _supported(model_name) else "eager"
    model = getattr(transformers, model_name)(cfg).eval()
    _sharpen(model, len(tok))
    return model


def _supported(model_name: str) -> set[str]:
    import transformers

    cls = getattr(transformers, model_name)
    return {"sdpa"} if getattr(cls, "_supports_sdpa", False) else set()


def build_masked(name: str, tok: Any, seed: int = 0) -> torch.nn.Module:
    """A tiny random masked LM (the diffusion family's models)."""
    import transformers

    torch.manual_seed(seed)
    common = dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    table = {
        "bert": ("BertConfig", "BertForMaskedLM",
                 dict(common, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=3,
                      num_attention_heads=HEADS, max_position_embeddings=128)),
        "roberta": ("RobertaConfig", "RobertaForMaskedLM",
                    dict(common, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=3,
                         num_attention_heads=HEADS, max_position_embeddings=132)),
        "distilbert": ("DistilBertConfig", "DistilBertForMaskedLM",
                       dict(common, dim=HIDDEN, hidden_dim=2 * HIDDEN, n_layers=3, n_heads=HEADS,
                            max_position_embeddings=128)),
        "modernbert": ("ModernBertConfig", "ModernBertForMaskedLM",
                       dict(common, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=3,
                            num_attention_heads=HEADS, max_position_embeddings=128, local_attention=8,
                            global_attn_every_n_layers=2, mask_token_id=tok.mask_token_id,
                            bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                            cls_token_id=tok.eos_token_id, sep_token_id=tok.eos_token_id)),
    }
    cfg_name, model_name, kw = table[name]
    model = getattr(transformers, model_name)(getattr(transformers, cfg_name)(**kw)).eval()
    _sharpen(model, len(tok))
    return model


# ---------------------------------------------------------------------- what runs where
LABELS = {
    "llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral", "mistral-window": "Mistral (window)",
    "gemma2": "Gemma-2", "gemma3": "Gemma-3 (text)", "phi3": "Phi-3", "gpt_neox": "GPT-NeoX", "gpt2": "GPT-2",
    "opt": "OPT", "falcon": "Falcon", "olmo2": "OLMo-2", "smollm3": "SmolLM3", "gptj": "GPT-J", "mamba": "Mamba",
    "bert": "BERT", "roberta": "RoBERTa", "distilbert": "DistilBERT", "modernbert": "ModernBERT",
}
KIND_OF = {a: ("windowed" if a in WINDOWED else "recurrent" if a in RECURRENT else "full") for a in CAUSAL}
EXACT_VS_GENERATE = ("greedy", "beam")
# decoders outside the speculative family that keep a model in a rolling-back DraftState
DRAFT_STATE = ("adadec", "cntp", "ead", "spec_cascade", "span_extract", "nest")  # each cuts a cache back (rollouts, span scoring)


def expected(decoder: Any, kind: str) -> tuple[str, str]:
    """(status, why) of a decoder class on a cache kind: ``exact`` (equals greedy or transformers
    ``generate`` token for token, tested), ``runs`` or ``refused`` (one line)."""
    from decoders.draft_tree import SpecDecoder

    spec = issubclass(decoder, SpecDecoder)
    if kind == "recurrent" and (spec or decoder.name in DRAFT_STATE):
        return "refused", "a rejected draft must be cut back out of the state; Mamba's recurrent state cannot be"
    if decoder.name in EXACT_VS_GENERATE or (spec and decoder.lossless):
        return "exact", ""
    return "runs", ""


def support_table() -> str:
    """The markdown tables of docs/models.md: cache kind per architecture, decoder per cache kind."""
    import decoders  # noqa: F401 - registers every decoder
    from decoders.base import all_decoders

    kinds = ("full", "windowed", "recurrent")
    heads = {k: ", ".join(LABELS[a] for a in CAUSAL if KIND_OF[a] == k) for k in kinds}
    lines = ["| cache kind | architectures in the matrix | what the rollback decoders do |", "|---|---|---|",
             f"| full attention | {heads['full']} | the model's own cache, cut back and reduced to the accepted path |",
             f"| sliding window / hybrid | {heads['windowed']} | a cache whose every layer keeps all positions "
             f"(the model applies its window); tree masks windowed per layer type |",
             f"| recurrent state | {heads['recurrent']} | refused in one line |",
             "", "| decoder | family | full attention | sliding window / hybrid | recurrent state |", "|---|---|---|---|---|"]
    mark = {"exact": "exact", "runs": "yes", "refused": "refused"}
    notes: dict[str, int] = {}
    for cls in all_decoders():  # number the notes in a fixed order, so new decoders do not renumber them
        for k in kinds:
            why = expected(cls, k)[1]
            if why:
                notes.setdefault(why, 0)
    notes = {why: i + 1 for i, why in enumerate(sorted(notes))}
    for cls in all_decoders():
        if cls.kind != "causal":
            continue
        cells = []
        for k in kinds:
            status, why = expected(cls, k)
            cell = mark[status]
            if why:
                cell += f" ({notes[why]})"
            cells.append(cell)
        lines.append(f"| `{cls.name}` | {cls.family} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"({n}) {why}." for why, n in notes.items() if any(f"({n})" in line for line in lines)]
    masked = ", ".join(LABELS[a] for a in MASKED)
    diff = ", ".join(f"`{c.name}`" for c in all_decoders() if c.kind == "diffusion")
    lines += ["", f"Diffusion decoders ({diff}) run on every masked LM of the matrix: {masked}."]
    return "\n".join(lines)


BEGIN, END = "<!-- arch-matrix:begin -->", "<!-- arch-matrix:end -->"


def doc_section(text: str) -> str:
    """The generated part of docs/models.md (between the markers)."""
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


if __name__ == "__main__":  # python3 tests/_arch_models.py --write: refresh docs/models.md
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    table = support_table()
    if "--write" in sys.argv:
        doc = Path(__file__).resolve().parent.parent / "docs" / "models.md"
        text = doc.read_text()
        head, rest = text.split(BEGIN, 1)
        doc.write_text(head + BEGIN + "\n" + table + "\n" + END + rest.split(END, 1)[1])
    else:
        print(table)
