"""Write ``docs/decoders.md``, the decoder catalogue, from the registry.

The catalogue is generated so it cannot drift from the code: every decoder's family, kind,
paper, knobs (type, default, range, help) and the evidence its steps carry come from the
decoder classes themselves. Run ``python -m playground.catalogue`` after adding a decoder.
"""

from __future__ import annotations

import inspect
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "decoders.md"

SHOWS = {
    "token": "per-step distribution (top-K raw vs final probabilities, chosen token and rank, entropy, kept mass)",
    "draft": "the draft tree of every step (q, p, acceptance probability, accepted path, correction or bonus token, source)",
    "denoise": "the canvas at every step (which positions were unmasked, confidence, entropy and margin per position, block)",
    "beam": "the beams at every step (ids, scores, parents, finished)",
    "jacobi": "the Jacobi window at every iteration (guesses and converged prefix)",
}

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

FAMILIES = {
    "sampling": "Sampling: one composable processor chain",
    "search": "Search",
    "contrastive": "Contrastive",
    "speculative": "Speculative and parallel decoding",
    "diffusion": "Diffusion LM decoding",
    "guided": "Guided decoding",
    "collab": "Collaboration: a small and a large model (or a diffusion and a causal one) together",
}


def _range(k: dict) -> str:
    if "choices" in k:
        return " / ".join(f"`{c}`" for c in k["choices"])
    if "items" in k:
        return "comma list of " + ", ".join(f"`{c}`" for c in k["items"])
    if "min" in k:
        return f"[{k['min']:g}, {k['max']:g}]"
    return ""


def render() -> str:
    """The catalogue as markdown."""
    from decoders import all_decoders

    classes = all_decoders()
    out = ["# Decoder catalogue", "",
           "Generated from the decoder registry by `python -m playground.catalogue`; "
           f"{len(classes)} decoders. Every knob is validated from this spec (CLI, API and UI alike).", ""]
    fams: dict[str, list] = {}
    for c in classes:
        fams.setdefault(c.family, []).append(c)
    out.append("| decoder | family | kind | lossless | paper |")
    out.append("|---|---|---|---|---|")
    for c in classes:
        out.append(f"| [`{c.name}`](#{c.name.replace('_', '-')}) | {c.family} | {c.kind} | "
                   f"{'yes' if c.lossless else ''} | {c.reference} |")
    for fam, members in fams.items():
        out += ["", f"## {FAMILIES.get(fam, fam.title())}", ""]
        for c in members:
            spec = c.spec()
            doc = inspect.cleandoc(c.__doc__ or "")
            out += [f"### {c.name}", "", f"*{spec['description']}*", "",
                    f"- paper: {c.reference}", f"- kind: `{c.kind}`"
                    + (" — needs a draft model" if c.needs_draft else "")
                    + (" — lossless (output distribution equals the target's)" if c.lossless else ""),
                    f"- shows: {SHOWS.get(c.step_kind, c.step_kind)}{FAMILY_SHOWS.get(c.family, '')}"
                    + "".join(v for k, v in KNOB_SHOWS.items() if k in spec["params"]), ""]
            if doc:
                out += [doc, ""]
            if spec["params"]:
                out += ["| knob | type | default | range | help |", "|---|---|---|---|---|"]
                for name, k in spec["params"].items():
                    out.append(f"| `{name}` | {k['type']} | `{k['default']}` | {_range(k)} | {k['help']} |")
                out.append("")
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    """Write the catalogue to docs/decoders.md."""
    DOC.write_text(render(), encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
