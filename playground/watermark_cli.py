"""``playground watermark-detect``: is this text watermarked with these settings?

Prints the z-score, the green fraction, the p-value and the verdict; ``--tokens`` adds one
line per token (green ``+``, red ``-``, unscored ``.``), ``--json`` prints everything,
per-token green/red and running z included. The settings must be the ones the text was
written with (``watermark`` decoder knobs or transformers' ``WatermarkingConfig``).

``--trace FILE`` scores a saved run instead (a trace JSON, or a session export with
``--lane N``, lanes numbered from 1 as on the page): its token ids after its prompt ids, with a
``watermark`` lane's own settings, so the figure is the one the lane's evidence shows (a
text re-encoded need not give back the tokens the run sampled).
"""

from __future__ import annotations

import argparse
import json

from decoders.guided.watermark import DEFAULT_KEY, SCHEMES, detect_ids, detect_text
import playground.inputs as inputs
from playground.core.errors import PlaygroundError
from playground.core.settings import limits
from playground.core.trace import validate_trace_dict


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The subcommand's options."""
    p.add_argument("--model", default="tiny-shakespeare", help="the model whose tokenizer wrote the text")
    p.add_argument("--text", default=None, help="the text to check")
    p.add_argument("--text-file", default=None, help="read the text from this file instead")
    p.add_argument("--trace", default=None, help="score a saved run's token ids instead: a trace JSON or a "
                                                  "session export (with --lane)")
    p.add_argument("--lane", type=int, default=1, help="with --trace on a session export: the lane, from 1")
    p.add_argument("--prompt", default="", help="the prompt the text followed (lets its first tokens be scored)")
    p.add_argument("--gamma", type=float, default=0.25, help="green-list share (transformers' greenlist_ratio)")
    p.add_argument("--seeding", default="lefthash", choices=list(SCHEMES))
    p.add_argument("--key", type=int, default=DEFAULT_KEY, help="hashing key")
    p.add_argument("--context-width", type=int, default=1)
    p.add_argument("--ignore-repeated-ngrams", action="store_true", help="count each distinct n-gram once")
    p.add_argument("--z-threshold", type=float, default=4.0, help="z above this reads as watermarked")
    p.add_argument("--tokens", action="store_true", help="print each token's colour")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--device", default="cpu", help="auto, cpu, cuda, mps (only the tokenizer and config are used)")
    p.add_argument("--trust-remote-code", action="store_true")


def _read_text(args: argparse.Namespace) -> str:
    """The text to score, from --text or --text-file, within PLAYGROUND_MAX_DETECT_CHARS."""
    if args.text is not None and args.text_file:
        raise PlaygroundError("give --text or --text-file, not both")
    text = args.text or ""
    if args.text_file:
        try:
            with open(args.text_file, encoding="utf-8") as f:
                text = f.read(limits().max_detect_chars + 1)
        except OSError as e:
            raise PlaygroundError(f"cannot read {args.text_file!r}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise PlaygroundError(f"{args.text_file!r} is not UTF-8 text") from None
    if not text.strip():
        raise PlaygroundError("give the text to check (--text or --text-file), or a saved run (--trace)")
    return inputs.text("the text", text, limits().max_detect_chars) or ""


def _read_trace(args: argparse.Namespace) -> dict:
    """The trace ``--trace`` names (a session export's lane ``--lane``, from 1), validated."""
    if args.text is not None or args.text_file:
        raise PlaygroundError("give --trace or a text, not both")
    try:
        with open(args.trace, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise PlaygroundError(f"cannot read {args.trace!r}: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise PlaygroundError(f"{args.trace!r} is not JSON ({e})") from None
    if isinstance(data, dict) and isinstance(data.get("runs"), list):
        runs = data["runs"]
        if not 1 <= args.lane <= len(runs):
            raise PlaygroundError(f"--lane {args.lane}: the session has lanes 1..{len(runs)}")
        data = runs[args.lane - 1]
    try:
        validate_trace_dict(data)
    except ValueError as e:
        raise PlaygroundError(f"{args.trace!r}: {e}") from None
    return data


def summary(res: dict) -> str:
    """One line: z, green count and fraction, p-value and the verdict."""
    verdict = "watermarked" if res["prediction"] else "no watermark detected"
    return (f"z = {res['z']:.2f} · green {res['green']}/{res['scored']} ({100 * res['green_fraction']:.0f}%, "
            f"expected {100 * res['gamma']:.0f}%) · p = {res['p_value']:.3g} · {verdict} "
            f"(threshold z > {res['z_threshold']:g})")


def run(args: argparse.Namespace) -> int:
    """Detect and print; user errors are PlaygroundError (one line, exit 2)."""
    if not 0.0 < args.gamma < 1.0:
        raise PlaygroundError(f"--gamma={args.gamma:g} must be strictly between 0 and 1")
    if args.context_width < 1:
        raise PlaygroundError("--context-width must be at least 1")
    common = dict(ignore_repeated_ngrams=args.ignore_repeated_ngrams, z_threshold=args.z_threshold,
                  device=args.device, trust_remote_code=args.trust_remote_code)
    if args.trace:
        tr = _read_trace(args)
        knobs = tr["params"] if tr["decoder"] == "watermark" else {}
        res = detect_ids(tr["model"], tr["output_ids"], tr["prompt_ids"],
                         gamma=float(knobs.get("watermark_gamma", args.gamma)),
                         key=int(knobs.get("watermark_key", args.key)),
                         seeding=str(knobs.get("watermark_seeding", args.seeding)),
                         context_width=int(knobs.get("watermark_context_width", args.context_width)), **common)
    else:
        res = detect_text(args.model, _read_text(args), prompt=args.prompt, gamma=args.gamma, key=args.key,
                          seeding=args.seeding, context_width=args.context_width, **common)
    if args.json:
        print(json.dumps(res, ensure_ascii=False))
        return 0
    print(summary(res))
    if args.tokens:
        for j, t in enumerate(res["tokens"]):
            mark = "." if t["green"] is None else ("+" if t["green"] else "-")
            print(f"{j:>5} {mark} {t['id']:>7} {t['z']:>7.2f}  {json.dumps(t['text'], ensure_ascii=False)}")
    return 0
