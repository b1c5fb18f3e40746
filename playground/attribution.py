"""Attribution: which earlier tokens drove a chosen token (``playground attribute``).

For a step of a causal trace, the context is the prompt plus the tokens committed before that
step, and the score is ``f = log p(token | context)`` (contrastive: ``log p(token) - log
p(contrast)``, "why this token rather than that one"). Each context token gets a number:

- ``gradient_x_input``: ``grad_e f · e`` summed over the embedding of the token (the first-order
  term of ``f`` in that embedding, Shrikumar et al. 2016);
- ``integrated_gradients``: ``(e - e0) · mean_k grad f(e0 + a_k (e - e0))`` with ``a_k`` the
  midpoints of ``steps`` equal intervals (Sundararajan et al. 2017). Its attributions add up to
  ``f(e) - f(e0)`` up to the Riemann error (completeness), which the result reports as ``f``,
  ``f_baseline`` and ``sum``. The baseline ``e0`` is every position holding the end-of-text
  token's embedding (``baseline="eos"``; not the pad token's, which models often leave at zero),
  or all zeros (``"zero"``). Zero is the textbook choice but a poor one for models without absolute position
  embeddings (Llama and most current models): their first RMSNorm makes the path ``a · e`` nearly
  constant except very close to ``a = 0``, so 32 equal steps miss most of the change.

Gradients are taken with respect to the input embeddings only (the model is not changed); the
whole context is attributed jointly in one backward pass per batch. Causal models only.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Sequence

import torch

from playground.core.errors import PlaygroundError
from playground.core.models import ModelHandle, load_model

METHODS = ("integrated_gradients", "gradient_x_input")
BASELINES = ("eos", "zero")
IG_BATCH = 8  # interpolation points per forward


def _score(handle: Any, embeds: torch.Tensor, target: int, contrast: int | None) -> torch.Tensor:
    """``f`` for a batch of embedded contexts (B, T, H): the last position's log-probability of
    ``target`` (minus that of ``contrast``), shape (B,)."""
    out = handle.model(inputs_embeds=embeds.to(handle.dtype), use_cache=False)
    last = out.logits[:, -1]
    logp = torch.log_softmax(last.float() if last.dtype in (torch.float16, torch.bfloat16) else last, -1)
    f = logp[:, target]
    return f - logp[:, contrast] if contrast is not None else f


def baseline_token(handle: Any) -> int | None:
    """The token of the ``eos`` baseline: the tokenizer's eos token, else the model's first, else None."""
    eos = getattr(handle.tokenizer, "eos_token_id", None)
    if isinstance(eos, int) and 0 <= eos < handle.vocab_size:
        return eos
    ids = sorted(t for t in getattr(handle, "eos_ids", ()) or () if 0 <= t < handle.vocab_size)
    return ids[0] if ids else None


def attribute_ids(handle: Any, context: Sequence[int], target: int, contrast: int | None = None,
                  method: str = "integrated_gradients", steps: int = 32, baseline: str = "eos") -> dict[str, Any]:
    """Attribute ``f`` (see the module docstring) to each token of ``context``.

    Returns ``{"method", "target", "contrast", "ids", "scores", "f"}`` and, for integrated
    gradients, ``steps``, ``baseline``, ``f_baseline`` and ``sum`` (completeness: ``sum ≈ f -
    f_baseline``).
    """
    if baseline not in BASELINES:
        raise PlaygroundError(f"unknown baseline {baseline!r}; use one of {', '.join(BASELINES)}")
    if method not in METHODS:
        raise PlaygroundError(f"unknown attribution method {method!r}; use one of {', '.join(METHODS)}")
    if getattr(handle, "kind", "causal") != "causal":
        raise PlaygroundError(f"attribution needs a causal model; {handle.name!r} is a {handle.kind} model")
    ids = [int(t) for t in context]
    if not ids:
        raise PlaygroundError("attribution needs a non-empty context")
    for t in [target] + ([contrast] if contrast is not None else []):
        if not 0 <= int(t) < handle.vocab_size:
            raise PlaygroundError(f"token id {t} is outside the vocabulary (size {handle.vocab_size})")
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= 512:
        raise PlaygroundError(f"steps must be a whole number in [1, 512], got {steps!r}")
    emb = handle.model.get_input_embeddings()
    with handle.lock, torch.enable_grad():
        x = emb(torch.tensor([ids], device=handle.device)).detach()
        if x.dtype in (torch.float16, torch.bfloat16):  # the sums are taken in float32 at least
            x = x.float()
        res: dict[str, Any] = {"method": method, "target": int(target),
                               "contrast": None if contrast is None else int(contrast), "ids": ids}
        if method == "gradient_x_input":
            e = x.clone().requires_grad_(True)
            f = _score(handle, e, target, contrast)
            (g,) = torch.autograd.grad(f.sum(), e)
            scores = (g * x).sum(-1)[0]
            res.update(f=float(f[0].detach()))
        else:
            base_tok = baseline_token(handle) if baseline == "eos" else None
            x0 = torch.zeros_like(x) if base_tok is None else \
                emb(torch.full((1, len(ids)), base_tok, device=handle.device)).detach().to(x.dtype)
            total = torch.zeros_like(x[0])
            alphas = [(k + 0.5) / steps for k in range(steps)]
            for j in range(0, steps, IG_BATCH):
                a = torch.tensor(alphas[j:j + IG_BATCH], device=x.device, dtype=x.dtype).view(-1, 1, 1)
                e = (x0 + a * (x - x0)).requires_grad_(True)
                f = _score(handle, e, target, contrast)
                (g,) = torch.autograd.grad(f.sum(), e)
                total += g.sum(0)
            scores = ((x - x0)[0] * total / steps).sum(-1)
            with torch.no_grad():
                f_x = float(_score(handle, x, target, contrast)[0])
                f_0 = float(_score(handle, x0, target, contrast)[0])
            res.update(steps=steps, baseline="zero" if base_tok is None else "eos", f=f_x, f_baseline=f_0,
                       sum=float(scores.sum()))
    res["scores"] = [float(s) for s in scores.detach().cpu()]
    return res


def step_context(trace: dict[str, Any], step: int) -> tuple[list[int], int]:
    """(context ids, the step's first committed token) of step ``step`` of a causal trace: the
    prompt plus every token committed before that step."""
    steps = trace.get("steps") if isinstance(trace.get("steps"), list) else []
    if not steps:
        raise PlaygroundError("the trace has no steps")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < len(steps):
        raise PlaygroundError(f"step must be in [0, {len(steps) - 1}], got {step!r}")
    if any(s.get("kind") == "denoise" for s in steps):
        raise PlaygroundError("attribution reads a causal trace; this one is a diffusion run")
    ids = [int(t) for t in trace.get("prompt_ids") or []]
    for s in steps[:step]:
        ids += [int(t) for t in s.get("committed") or []]
    committed = steps[step].get("committed") or []
    if not committed:
        raise PlaygroundError(f"step {step} committed no token")
    return ids, int(committed[0])


def attribute(trace: Any, step: int, token: int | None = None, contrast: int | None = None,
              method: str = "integrated_gradients", steps: int = 32, model: Any = None,
              baseline: str = "eos") -> dict[str, Any]:
    """Attribute a token of a trace's step to its context (prompt and generated tokens).

    ``trace``: a trace dict or :class:`~playground.core.trace.Trace` (a replay needs the model, loaded
    by name from the trace unless ``model`` gives a name or handle). ``token`` defaults to the
    step's (first) committed token; ``contrast`` asks why ``token`` rather than this one. Adds
    ``step``, ``texts`` (each context token's text) to :func:`attribute_ids`' result.
    """
    d = trace.to_dict() if hasattr(trace, "to_dict") else trace
    if not isinstance(d, dict):
        raise PlaygroundError("attribute needs a trace")
    ids, chosen = step_context(d, step)
    handle = model if isinstance(model, ModelHandle) else load_model(model or d.get("model") or "tiny-shakespeare")
    res = attribute_ids(handle, ids, chosen if token is None else int(token), contrast, method, steps, baseline)
    tok = handle.tokenizer
    res["step"] = step
    res["texts"] = [tok.decode([t], skip_special_tokens=False, clean_up_tokenization_spaces=False) for t in ids]
    return res


# ---------------------------------------------------------------------- the subcommand
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The subcommand's options."""
    p.add_argument("--trace", required=True, help="a trace JSON file (generate --json writes one)")
    p.add_argument("--step", type=int, required=True, help="the step whose token to explain")
    p.add_argument("--token", type=int, default=None, help="token id to explain (default: the step's token)")
    p.add_argument("--contrast", type=int, default=None, help="explain the token rather than this token id")
    p.add_argument("--method", default="integrated_gradients", choices=list(METHODS))
    p.add_argument("--steps", type=int, default=32, help="integrated-gradient interpolation steps")
    p.add_argument("--baseline", default="eos", choices=list(BASELINES), help="integrated-gradient baseline")
    p.add_argument("--model", default=None, help="the model (default: the trace's)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    """Attribute and print one line per context token (score, text), strongest marked."""
    try:
        with open(args.trace, encoding="utf-8") as f:
            trace = json.load(f)
    except (OSError, ValueError) as e:
        raise PlaygroundError(f"cannot read the trace {args.trace!r}: {e}") from None
    if isinstance(trace, list):  # compare --json writes a list of lanes: take the first
        trace = trace[0] if trace else {}
    res = attribute(trace, args.step, args.token, args.contrast, args.method, args.steps, args.model, args.baseline)
    if args.json:
        print(json.dumps(res, ensure_ascii=False))
        return 0
    top = max(range(len(res["scores"])), key=lambda j: abs(res["scores"][j]))
    for j, (s, t) in enumerate(zip(res["scores"], res["texts"])):
        print(f"{j:>5} {s:+9.4f} {'*' if j == top else ' '} {json.dumps(t, ensure_ascii=False)}")
    if "sum" in res:
        print(f"sum {res['sum']:+.4f} vs f(x) - f(baseline) {res['f'] - res['f_baseline']:+.4f}")
    return 0


__all__ = ["BASELINES", "METHODS", "add_arguments", "baseline_token", "attribute", "attribute_ids", "run", "step_context"]
