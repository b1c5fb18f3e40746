"""Write ``docs/decoders.md``, the decoder catalogue, from the registry.

The catalogue is generated so it cannot drift from the code: every decoder's family, kind,
knobs (type, default, range, help), the evidence its steps carry and the page's plots come
from the decoder classes, ``playground.trace.STEP_KINDS`` and ``visualizers``; the paper
links come from ``playground.papers``. What is written by hand is the prose a reader needs
around them: a glossary, a primer per family, and the shared knob tables (shown once; each
decoder lists only the knobs specific to it). A decoder of a family with no primer, or with a
knob no shared table holds, still renders: its family gets a plain heading and its knobs a
table of their own. Run ``python -m playground.catalogue`` after adding a decoder.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from playground.papers import markdown as papers_markdown
from playground.papers import scrub, short_markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "decoders.md"

# What a family's steps record beyond their step kind's evidence.
FAMILY_SHOWS = {
    "contrastive": "; plus the paired distributions behind the contrast (`contrast`: which tokens it moved), "
                   "the candidate table of contrastive search, DoLa's per-layer divergence and look-back's KL alarm "
                   "with its candidates",
}

# What a decoder's steps record when it has a knob of this name and the knob is set.
KNOB_SHOWS = {
    "regex": "; under a constraint (`regex`, `json_schema`, `grammar`, `logit_bias`, `bad_words`, `token_healing`) "
             "each step also records `constraint`: allowed tokens, the probability mass the constraint removed, "
             "the top allowed and blocked tokens",
    "watermark_gamma": "; plus `watermark` per step: whether the token fell in its green list, the green list's "
                       "probability before and after delta, and the output's running z-score",
    "ess_threshold": "; plus `smc` per step: each particle's normalised weight, log weight and potential, the "
                     "effective sample size against its threshold, and whether (and from which ancestors) the "
                     "population was resampled",
}

# Section titles, in the order the catalogue presents the families (a family not listed here
# follows, under its own name).
FAMILIES = {
    "sampling": "Sampling: one composable processor chain",
    "search": "Search",
    "contrastive": "Contrastive",
    "speculative": "Speculative and parallel decoding",
    "diffusion": "Diffusion LM decoding",
    "guided": "Guided decoding",
    "collab": "Collaboration: a small and a large model (or a diffusion and a causal one) together",
}

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

FAMILY_PRIMERS = {
    "sampling": """\
Each step is one target forward: the model gives a next-token distribution, a chain of rules
reshapes it, and one token is drawn. **Plots:** *Distribution* (the top-K tokens, the model's raw
probability beside the final one after the chain, the chosen token and its rank) and, over the
run, *Entropy and probability*. Lanes share their random numbers (`coupling=gumbel`), so a
filtered lane differs from `sample` only where its rule cut the token `sample` drew: race them
side by side and the first divergence shows exactly what the rule did.

**Which one:** `greedy` is the deterministic baseline and the reference every lossless
speculative decoder must reproduce. `top_p` and `min_p` are everyday sampling (min-p scales its
cut with the top token's probability: it keeps many tokens when the model is unsure and few when
it is sure). `typical`, `epsilon` and `eta` are other truncation rules on the same draws;
`mirostat` holds the surprise near a target; `xtc` removes the most likely choices to force
variety; `sample` composes any of them in any `order`.

**Knobs that matter:** `temperature` (0 = greedy), one truncation knob at a time (`top_k`,
`top_p`, `min_p`), the repetition controls (`repetition_penalty`, DRY) and `logit_lens`.""",
    "search": """\
Search keeps several partial outputs (beams) per step and returns the best finished one, so a
step is a **beam step**: its plot is the *Beam tree* (each beam's tokens, scores and parent,
finished hypotheses marked) and the run plot the beams' scores. Sample-and-rank decoders
(`best_of_n`, `mbr`, `arithmetic`) draw complete candidates and pick one; their last step shows
the candidates and the scores that chose (*MBR utilities* for `mbr`). Uncertainty-triggered
decoders (`cntp`, `adadec`) are greedy token steps until the model's entropy crosses a
threshold, and there try several rollouts (*Rollouts*) and keep the most likely.

**Which one:** `beam` (equal to transformers' `generate(num_beams=k)`) for the most probable
output a fixed budget finds; `diverse_beam` when the beams all say the same thing;
`uid_beam` to penalise uneven surprisal (*Surprisal curve*); `best_first_beam` for beam
search's answer from a priority queue (*Frontier and pops*); `cntp` and `adadec` to spend
search only where the model hesitates; `arithmetic` for diverse samples without duplicates;
`best_of_n` and `mbr` to spend compute on choosing among samples (mbr picks the candidate that
agrees most with the others).

**Knobs that matter:** `num_beams` (cost grows with it), `length_penalty` (> 0 favours long
outputs), `early_stopping`/`patience` (when the search counts as done), the number of candidates.""",
    "contrastive": """\
Contrastive decoders score each token by how a second opinion moves it: a smaller *amateur*
model, an earlier layer, the prompt without its context, a negative prompt, or an n-gram model
of the text so far. A step is a token step and records both distributions. **Plots:**
*Paired distributions* (the model's own top tokens beside the contrasted ones, with the tokens
the contrast moved), *Layer divergence* for DoLa, *Candidates* for contrastive search, and the
chosen token's rank over the run. Second passes and amateur forwards are counted, so a race at
equal target forwards shows what the contrast costs.

**Which one:** `contrastive_search` against degenerate repetition with one model;
`contrastive` with a small amateur in the draft slot; `dola` for factual recall (final vs an
early layer); `cfg` to stay on the prompt's topic or away from a negative prompt; `cad` when the
prompt holds a context the answer must use; `fsd` and `lookback` as cheap anti-repetition.

**Knobs that matter:** the contrast strength (`alpha`, `beta`, `guidance_scale`), the
plausibility cut that keeps the contrast from promoting nonsense, and `temperature`.""",
    "speculative": """\
Speculative decoders draft several tokens cheaply and let the target verify them all in one
forward, so each **draft step** commits one or more tokens per target forward. **Plots:** the
*Draft tree* of a step (each drafted token with its draft probability q and target probability
p, the accepted path in green, the correction or bonus token that ends it) and, over the run,
*Accepted length* and *Acceptance over time*; at a rejection the *Correction distribution*
max(0, p - q) appears. With the default `strict` rule every decoder here is **lossless**: it
returns `greedy`'s text at temperature 0 and the target's distribution at temperature 1, just in
fewer target forwards. Corrections only appear when both models sample (temperature > 0).

**Which one:** `speculative` with a small draft model (the classic); `spec_tree` drafts a tree
and verifies all of it in one pass; `prompt_lookup`, `ngram_adaptive` and `token_recycling`
need no draft model (they copy from the prompt, an n-gram table or past candidates, so they
shine on repetitive text); `layer_skip` drafts with the target's own first layers; `mask_probe`
with mask-token probes; `jacobi` and `lookahead` iterate a window of guesses (greedy only).

**Knobs that matter:** `gamma` (tokens drafted per step: too few wastes the verification, too
many wastes drafts), `temperature`, and `accept` (the lossy rules raise acceptance and say how
many tokens they changed). Races default to equal target forwards, where drafting is free: read
the wall-time and cost axes too.""",
    "diffusion": """\
A masked-diffusion LM writes on a **canvas** of mask tokens and fills it in over denoising
steps, several positions per step and in any order; each **denoise step** is one forward over
the whole canvas. **Plots:** the *Canvas* at a step (committed tokens, positions unmasked at
this step highlighted, still-masked ones greyed), *Per-position metrics* (confidence, entropy,
margin), and over the run the *Unmasking heatmap* (position x step: read the order the model
chose), *Commits per step* (the parallelism) and confidence over steps. These decoders run on
the bundled `tiny-shakespeare-diffusion` model, on LLaDA and Dream (remote code) and on plain
masked LMs.

**Which one:** `llada` (the reference sampler: a fixed number of commits per step, most
confident first) and `dream` (its own schedule and token sampling); `fast_dllm` commits every
position above a confidence threshold (many per step when the model is sure); `sched` and
`prophet` stop refining early once the whole span, or the top-2 gap, is confident;
`pc_sampler` reweights positions to avoid committing trivial tokens first; `credit` carries
confidence across steps; `freedave` is lossless: the same text as one-token-per-step decoding
in fewer forwards; `masked_diffusion` exposes every choice as a knob.

**Knobs that matter:** `gen_length` (canvas size), `steps` (fewer steps = more tokens per
step), `block_length` (semi-autoregressive blocks), `threshold` for the threshold plans and
`temperature`.""",
    "guided": """\
Guided decoders change what may be written, not how the model scores it. **Plots:** the
*Constraint* view of a step (allowed tokens, the probability mass the constraint removed, the
top allowed and blocked tokens) and *Constraint over the run*; a watermarked lane colours each
token green or red and plots its *Watermark z-score*; SMC shows its *Particles* (weights,
ancestry, resampling) and the *Effective sample size*. Any token-step or speculative decoder
also takes the constraint knobs (`regex`, `json_schema`, `grammar`): see
[Constraint knobs](#constraint-knobs).

**Which one:** a constraint knob on any decoder for structured output (it masks token by token,
which can distort the distribution); `smc` to sample from the model *conditioned* on a
constraint or potential, reweighting particles instead of masking greedily;
`constrained_beam` when the output must contain given words; `watermark` to mark text so that a
detector with the key recognises it.

**Knobs that matter:** the constraint itself, `num_particles` and `ess_threshold` for SMC,
`watermark_gamma` and `watermark_delta` (detectability vs quality).""",
    "collab": """\
Two models share the work: a small one writes where it can and a large one where it must, or a
diffusion model drafts for a causal one. **Plots:** the *Draft tree* for the decoders that
verify drafts (with the *Diffusion draft canvas* of `diffuspec`: its block after each
denoising forward), and for `ead` the distribution of each step with *Who wrote each token*
over the run (the small model's entropy against the threshold). Both models' forwards are
counted.

**Which one:** `diffuspec` (a masked-diffusion draft, verified losslessly); `spec_cascade`
(speculative cascades: a deferral rule lets the small model's token stand when the large one
would not do much better; lossy by design); `ead` (switch to the large model while the small
one's entropy is high).

**Knobs that matter:** `gamma`, the deferral `rule` and `alpha`, `entropy_threshold`.""",
}


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
    from decoders.guided._constraint import constraint_params
    from decoders.processors import chain_params
    from decoders.speculative._verify import rule_params

    def spec(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {n: p.to_dict() for n, p in params.items()}

    return [
        ("The sampling chain",
         "The processor chain of `sample` (after llama.cpp's sampler chain): penalties, DRY, no-repeat n-grams, "
         "top-nσ, top-k, typical, top-p, min-p, ε, η, XTC, temperature and mirostat, applied in `order`. Each rule "
         "is off at its default. The speculative decoders apply the same chain to the draft and the target "
         "(without mirostat, with their own temperature default). A chain never empties: if a rule would remove "
         "every token, the most probable live one is kept and the step says so.",
         spec(chain_params())),
        ("Acceptance rules",
         "How a draft-based decoder decides which drafted tokens stand. `strict` is speculative sampling's rule and "
         "the only lossless one; the others accept more drafts, change the output and count the tokens they changed.",
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
    from playground.trace import STEP_KINDS

    kind = STEP_KINDS.get(step_kind)
    return kind.shows if kind else f"`{step_kind}` steps"


def _family_order(fams: dict[str, list]) -> list[str]:
    return [f for f in FAMILIES if f in fams] + sorted(f for f in fams if f not in FAMILIES)


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
        declared = family_of(fam)  # a family's own module may declare its title and primer
        out += [f"## {FAMILIES.get(fam, declared.title)}", ""]
        primer = FAMILY_PRIMERS.get(fam, declared.primer)
        if primer:
            out += [primer, ""]
        for c in fams[fam]:
            spec = c.spec()
            doc = scrub(inspect.cleandoc(c.__doc__ or ""))
            kind = f"- model: `{c.kind}`" + (" — needs a draft model" if c.needs_draft else "") \
                + (" — lossless (output distribution equals the target's)" if c.lossless else "")
            shows = f"- steps: `{c.step_kind}` — {_shows(c.step_kind)}{FAMILY_SHOWS.get(c.family, family_of(c.family).shows)}" \
                + "".join(v for k, v in KNOB_SHOWS.items() if k in spec["params"])
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
