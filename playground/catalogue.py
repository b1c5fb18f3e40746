"""Write ``docs/decoders.md``, the decoder catalogue, from the registry.

The catalogue is generated so it cannot drift from the code: every decoder's family, kind,
knobs (type, default, range, help), the evidence its steps carry and the page's plots come
from the decoder classes, ``playground.core.trace.STEP_KINDS`` and ``visualizers``; the paper
links come from ``playground.papers``; each family's title, place, primer and extra evidence
come from its own module's :func:`decoders.base.declare_family`, a decoder's extra evidence from
its class's ``shows``. What is written here by hand is the prose around them: the introduction,
a glossary and the shared knob tables (shown once; each decoder lists only the knobs specific
to it). A decoder of an undeclared family, or with a knob no shared table holds, still renders:
its family gets a plain heading and its knobs a table of their own. Run
``python -m playground.catalogue`` after adding a decoder.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from playground.papers import markdown as papers_markdown
from playground.papers import scrub, short_markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "decoders.md"

# What the steps of a decoder that takes the constraint knobs (the shared constraint stage)
# record; the rest of a step's evidence is declared by its step kind, family and decoder class.
CONSTRAINT_SHOWS = ("; under a constraint (`regex`, `json_schema`, `grammar`, `logit_bias`, `bad_words`, "
                    "`token_healing`) each step also records `constraint`: allowed tokens, the probability mass "
                    "the constraint removed, the top allowed and blocked tokens")

INTRO = """\
Every decoder the playground runs, generated from the decoder registry by
`python -m playground.catalogue` ({n} decoders in {f} families). Each family opens with a short
primer (what its plots show, when to use which decoder, the knobs that matter); each decoder
then gives its papers, the evidence its steps record, how it works, and the knobs specific to
it. Knobs several decoders share (the sampling chain, the acceptance rules, the constraint
knobs, the logit lens) are tabled once under [Shared knobs](#shared-knobs). Every knob is
validated from this spec, on the page, the command line and the API alike: a value out of range
is refused in one line, never clipped.

To try a decoder on the bundled models: `playground generate --decoder NAME --prompt "ROMEO." --max-new-tokens 32`
(add `--draft tiny-shakespeare-draft` where a decoder needs a draft model and
`--model tiny-shakespeare-diffusion` for the diffusion family), or pick it in a lane of the page."""

GLOSSARY = [
    ("target forward", "one forward pass of the lane's model (the *target*) over any number of new positions. "
                       "Races and stats count these; a pass that scores 6 drafted tokens is one target forward."),
    ("step", "one unit of a decoder's work as the trace records it: a token step commits one token, a draft step "
             "a verified run of tokens, a denoise step whatever the canvas committed. The inspector's scrubber "
             "walks steps; each step has a *kind* that picks its plots."),
    ("draft", "tokens proposed cheaply (by a small model, an n-gram table, the target's own early layers, mask "
              "probes) for the target to check. A *draft tree* proposes several continuations at once."),
    ("verification", "the target scores every drafted position in one forward and keeps the longest prefix its "
                     "acceptance rule allows; the first position it refuses gets a *correction* token, and a fully "
                     "accepted draft earns a free *bonus* token."),
    ("acceptance", "share of drafted tokens the target kept (accepted drafted tokens / drafted tokens); *mean "
                   "accepted length* is accepted drafted tokens per verification. `strict` acceptance (accept x "
                   "with probability min(1, p(x)/q(x)), resample from max(0, p - q) at a rejection) is exact."),
    ("lossless", "the decoder's output has exactly the target's distribution: at temperature 0 it returns "
                 "`greedy`'s text token for token, at temperature 1 it samples what plain sampling samples "
                 "(the tests check both). Lossy acceptance rules trade that for speed and count what they changed."),
    ("canvas", "a diffusion LM's output window: `gen_length` positions that start as mask tokens and are filled in "
               "(*unmasked*, *committed*) over denoising steps, in any order, several per step."),
    ("block", "semi-autoregressive diffusion: the canvas is cut into blocks of `block_length` decoded left to right; "
              "within a block positions are unmasked in any order."),
    ("remasking", "the rule deciding which predicted positions to commit at a step and which to leave masked: "
                  "the most confident (`low_confidence` in LLaDA), random ones, all above a threshold (Fast-dLLM), "
                  "or everything once the model is sure (Prophet)."),
    ("beam / particle", "a partial output a search keeps alive. Beams are pruned by score; SMC particles are "
                        "reweighted by potentials and resampled."),
    ("constraint", "a regular expression, JSON Schema or grammar the output must satisfy, or a token bias/ban "
                   "list: disallowed tokens are masked before the choice, and the step records the mass removed."),
    ("watermark", "a key-seeded green list per position whose tokens get a logit bonus; a detector with the key "
                  "counts green tokens and reports a z-score (`playground watermark-detect`)."),
    ("common random numbers", "lanes that sample share one random number per position and token "
                              "(`coupling=gumbel`), so two samplers differ only where their rules differ."),
    ("logit lens", "the top tokens each layer's hidden state would predict through the final norm and LM head, "
                   "recorded per step without an extra forward."),
]

def _anchor(title: str) -> str:
    """GitHub's heading slug: lower case, punctuation dropped (not _ or -), spaces to hyphens."""
    keep = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -_")
    return keep.replace(" ", "-")


def _range(k: dict[str, Any]) -> str:
    if "choices" in k:
        return " / ".join(f"`{c}`" for c in k["choices"])
    if "items" in k:
        return "comma list of " + ", ".join(f"`{c}`" for c in k["items"])
    if "min" in k:
        return f"[{k['min']:g}, {k['max']:g}]"
    return ""


def _knob_table(params: dict[str, dict[str, Any]]) -> list[str]:
    out = ["| knob | type | default | range | help |", "|---|---|---|---|---|"]
    for name, k in params.items():
        default = f"`{k['default']}`" if k["default"] != "" else "(empty)"  # `` would render as two backticks
        out.append(f"| `{name}` | {k['type']} | {default} | {_range(k)} | {scrub(k['help'])} |")
    return out


def knob_groups() -> list[tuple[str, str, dict[str, dict[str, Any]]]]:
    """The shared knob tables: (title, explanation, {knob: spec}), from the code that defines
    them, so a decoder's knob counts as shared exactly when its spec is the shared one."""
    from decoders.base import lens_param
    from decoders.constraint import constraint_params
    from decoders.processors import chain_params
    from decoders.draft_tree import rule_params

    def spec(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {n: p.to_dict() for n, p in params.items()}

    return [
        ("The sampling chain",
         "The processor chain of `sample` (after llama.cpp's sampler chain): penalties, DRY, no-repeat n-grams, "
         "top-nσ, top-k, typical, top-p, min-p, ε, η, XTC, temperature and mirostat, applied in `order`. Each rule "
         "is off at its default. The speculative decoders apply the same chain to the draft and the target "
         "(without mirostat, with their own temperature default). A chain never empties: if a rule would remove "
         "every token, the most probable live one is kept and the step says so. Each step records the chain stage by "
         "stage in the order applied (the constraint's `logit_bias` and mask first): what each stage removed "
         "(`removed`, the most probable removed and kept tokens with their probability entering it) and, under "
         "Gumbel coupling, the token the run's noise draws entering and leaving it, so the *Sampler chain* plot "
         "shows which rule removed the token plain sampling would have drawn. Order matters (top-k then top-p "
         "measures top-p's mass on what top-k left): the `truncation-samplers` preset's last lane runs "
         "`top_p,top_k`.",
         spec(chain_params())),
        ("Acceptance rules",
         "How a draft-based decoder decides which drafted tokens stand. `strict` is speculative sampling's rule and "
         "the only lossless one; the others accept more drafts, change the output and count the tokens they changed. "
         "`cactus` (Hao & Mou 2026, https://arxiv.org/abs/2604.04987) raises the drafted token's target probability "
         "within a KL budget `cactus_delta` and resamples rejections from that modified target, so it changes "
         "nothing at temperature 0; `additive` and `multiplicative` are the relaxed rules whose rejection region is "
         "a lower level set of the target (accept when p(x) >= max p - `relax_delta`, or >= `relax_rho` · max p: "
         "our reading of the relaxed criteria of Sharma 2026, https://arxiv.org/abs/2606.30265). Every verified drafted token records the acceptance "
         "probability each rule would give it, drawn side by side in the *Acceptance by rule* plot and the draft "
         "tree's hover.",
         spec(rule_params())),
        ("Constraint knobs",
         "Set one of `regex`, `json_schema`, `grammar` (llguidance) to constrain the output; `logit_bias` and "
         "`bad_words` bias or ban tokens; `token_healing` re-spells the prompt's last token. Disallowed tokens are "
         "masked before the choice and each step records what the constraint removed.",
         spec(constraint_params(words=True, healing=True))),
        ("Logit lens",
         "Records, at each step, the top tokens every layer would predict (no extra forward); drawn as a "
         "layers × rank view in the inspector.",
         spec({"logit_lens": lens_param()})),
    ]


# How a decoder's section names a shared table it takes.
_GROUP_NAMES = {"The sampling chain": "the sampling chain knobs", "Acceptance rules": "the acceptance-rule knobs",
                "Constraint knobs": "the constraint knobs", "Logit lens": "the logit lens"}


def _split_knobs(params: dict[str, dict[str, Any]], groups: list) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The decoder's own knobs, and one line per shared table it uses (naming the knobs it takes
    when it takes only some)."""
    own, used = {}, {}
    for name, k in params.items():
        for title, _, shared in groups:
            if shared.get(name) == k:
                used.setdefault(title, []).append(name)
                break
        else:
            own[name] = k
    lines = []
    for title, _, shared in groups:
        names = used.get(title)
        if not names:
            continue
        link = f"[{_GROUP_NAMES.get(title, title)}](#{_anchor(title)})"
        missing = [n for n in shared if n not in names]
        if not missing:
            lines.append(f"{link} (all {len(shared)})" if len(shared) > 1 else link)
        elif len(missing) <= len(shared) // 2:
            lines.append(f"{link} (all {len(shared)} but " + ", ".join(f"`{n}`" for n in missing) + ")")
        else:
            lines.append(f"{link}: " + ", ".join(f"`{n}`" for n in names))
    return own, lines


def _has_constraint_stage(spec: dict[str, Any]) -> bool:
    """Whether a decoder runs the constraint stage: its three grammar knobs come together (dingo's
    own ``regex`` knob alone is not the stage)."""
    return all(k in spec["params"] for k in ("regex", "json_schema", "grammar"))


def _plots_line(step_kind: str) -> str:
    """The page's plots every step of this kind gets, from the visualizer registry (plots that
    need an evidence field are implied by the "steps" line, which names the fields)."""
    try:
        from visualizers import RUN_PLOTS, STEP_PLOTS
    except ImportError:  # a catalogue without plotly still renders
        return ""
    step = [f"*{t}*" for t, _, field in STEP_PLOTS.get(step_kind, []) if not field]
    run = [f"*{t}*" for t, _ in RUN_PLOTS.get(step_kind, [])]
    if not step and not run:
        return ""
    return "- plots: " + ", ".join(step) + ("; over the run " + ", ".join(run) if run else "")


def _shows(step_kind: str) -> str:
    from playground.core.trace import STEP_KINDS

    kind = STEP_KINDS.get(step_kind)
    return kind.shows if kind else f"`{step_kind}` steps"


def _family_order(fams: dict[str, list]) -> list[str]:
    from decoders.base import family_of

    return sorted(fams, key=lambda f: (family_of(f).order, f))


def render() -> str:
    """The catalogue as markdown."""
    from decoders import all_decoders
    from decoders.base import family_of

    classes = all_decoders()
    fams: dict[str, list] = {}
    for c in classes:
        fams.setdefault(c.family, []).append(c)
    order = _family_order(fams)
    groups = knob_groups()
    out = ["# Decoder catalogue", "", INTRO.format(n=len(classes), f=len(fams)), ""]

    out += ["| decoder | family | step | needs | lossless | paper |", "|---|---|---|---|---|---|"]
    for fam in order:
        for c in fams[fam]:
            needs = "draft model" if c.needs_draft else ("diffusion model" if c.kind == "diffusion" else "")
            out.append(f"| [`{c.name}`](#{_anchor(c.name)}) | {fam} | {c.step_kind} | {needs} | "
                       f"{'yes' if c.lossless else ''} | {short_markdown(c.name, c.reference)} |")

    out += ["", "## Words used on this page", ""]
    out += [f"- **{word}**: {text}" for word, text in GLOSSARY]

    out += ["", "## Shared knobs", "",
            "These tables are shown once; a decoder's section says which of them it takes.", ""]
    for title, sentence, shared in groups:
        out += [f"### {title}", "", sentence, ""] + _knob_table(shared) + [""]

    for fam in order:
        declared = family_of(fam)  # the family's own module declares its title and primer
        out += [f"## {declared.title}", ""]
        if declared.primer:
            out += [declared.primer, ""]
        for c in fams[fam]:
            spec = c.spec()
            doc = scrub(inspect.cleandoc(c.__doc__ or ""))
            kind = f"- model: `{c.kind}`" + (" — needs a draft model" if c.needs_draft else "") \
                + (" — lossless (output distribution equals the target's)" if c.lossless else "")
            shows = f"- steps: `{c.step_kind}` — {_shows(c.step_kind)}{family_of(c.family).shows}" \
                + (CONSTRAINT_SHOWS if _has_constraint_stage(spec) else "") + c.shows
            out += [f"### {c.name}", "", f"*{scrub(spec['description'])}*", "",
                    f"- papers: {papers_markdown(c.name, c.reference)}", kind, shows]
            plots = _plots_line(c.step_kind)
            out += ([plots] if plots else []) + [""]
            if doc and doc.rstrip(".") != scrub(spec["description"]).rstrip("."):  # not the italic line again
                out += [doc, ""]
            own, shared_lines = _split_knobs(spec["params"], groups)
            if own:
                out += _knob_table(own)
            if shared_lines:
                out += ([""] if own else []) + [("and " if own else "Knobs: ") + "; ".join(shared_lines) + "."]
            if own or shared_lines:
                out.append("")
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    """Write the catalogue to docs/decoders.md."""
    DOC.write_text(render(), encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
