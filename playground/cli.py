"""The ``playground`` command line (a contract; see docs/architecture.md).

Every user error is one line on stderr and exit status 2; nothing prints a traceback for it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any, Sequence

from playground.core.errors import PlaygroundError
from playground.presets import list_presets

# The engine, the API, the decoders and the model package (all of which load torch) are imported
# inside the functions that use them: the CLI imports only the chosen subcommand's module, and
# `playground --help`, `list-presets` or `sessions list` start without loading torch.

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise PlaygroundError(message)


def _parse_param(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise PlaygroundError(f"--param wants NAME=VALUE, got {text!r}")
    k, v = text.split("=", 1)
    k = k.strip()
    if not k:
        raise PlaygroundError(f"--param wants NAME=VALUE, got {text!r}")
    return k, v.strip()


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="bundled name, local path, or hub id (default tiny-shakespeare)")
    p.add_argument("--prompt", default=None, help="the prompt text")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print the trace(s) as JSON")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    p.add_argument("--quantization", default=None, choices=[None, "4bit", "8bit"])
    p.add_argument("--device-map", default=None, help="'auto' spreads a big model over devices")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="run the model repository's own code (LLaDA, Dream); off by default")
    p.add_argument("--chat", action="store_true",
                   help="send the prompt through the model's chat template (instruct models), in every lane")
    p.add_argument("--system-prompt", default=None, help="a system turn before the prompt (needs --chat)")
    p.add_argument("--watch", action="append", default=[], metavar="WORD|#ID",
                   help="record this token's probability and rank at every step (word or #token_id; "
                        "repeatable, or comma-separated)")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser with every subcommand.

    The plugin subcommands (bench, train-tiny, sessions) import their module only when they
    are the command being run, so `playground sessions list` does not pay for importing torch.
    """
    wanted = next((a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("-")), None)
    parser = _Parser(prog="playground", description="Decoder Playground")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    g = sub.add_parser("generate", help="run one decoder")
    _add_run_options(g)
    g.add_argument("--decoder", default="greedy")
    g.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    g.add_argument("--draft", default=None, help="draft model for speculative decoders")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--force", action="append", default=[], metavar="POS:TOKEN_ID",
                   help="emit TOKEN_ID as generated token POS (from 0); repeatable")

    c = sub.add_parser("compare", help="run a preset's lanes")
    _add_run_options(c)
    c.add_argument("--preset", required=True)

    ld = sub.add_parser("list-decoders", help="every decoder with its knobs")
    ld.add_argument("--json", action="store_true")
    ld.add_argument("--family", default=None)
    lm = sub.add_parser("list-models", help="models loadable offline")
    lm.add_argument("--json", action="store_true")
    lp = sub.add_parser("list-presets", help="named comparisons")
    lp.add_argument("--json", action="store_true")

    for name, module, help_ in (
        ("bench", "playground.bench", "run a benchmark suite (see docs/benchmarks.md)"),
        ("screenshots", "playground.screenshots", "write docs/screenshots/*.png (starts the app and Chromium)"),
        ("train-tiny", "playground.train_tiny", "rebuild the bundled tiny models"),
        ("sessions", "playground.sessions_cli", "stored sessions: list, export, import, delete"),
        ("watermark-detect", "playground.watermark_cli", "z-score of a green-list watermark in a text"),
        ("study", "playground.study", "run a comparison over a prompt set; aggregate per lane"),
        ("votes", "playground.votes_cli", "blind comparisons: mark sessions blind, read the votes' Bradley–Terry table"),
        ("sweep", "playground.sweep", "run one decoder over a grid of one or two knobs; a grid of metrics"),
        ("attribute", "playground.attribution", "which context tokens drove a step's token (IG, gradient x input)"),
    ):
        sp = sub.add_parser(name, help=help_)
        sp.set_defaults(_module=module)
        if wanted != name:
            continue
        try:
            importlib.import_module(module).add_arguments(sp)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            sp.set_defaults(_missing=True)
    return parser


def _load_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {"device": args.device, "dtype": args.dtype, "quantization": args.quantization,
            "device_map": args.device_map, "trust_remote_code": args.trust_remote_code}


def _watch(args: argparse.Namespace) -> list[str]:
    """The --watch items (each flag may hold several, comma-separated; spaces are kept, they
    change the token: " the" is the word inside a line)."""
    return [w for flag in args.watch for w in flag.split(",") if w.strip()]


def _cmd_generate(args: argparse.Namespace) -> int:
    from playground.engine import prepare

    params = dict(_parse_param(p) for p in args.param)
    if args.prompt is None:
        raise PlaygroundError("--prompt is required")
    run = prepare(model=args.model or "tiny-shakespeare", decoder=args.decoder, prompt=args.prompt,
                  max_new_tokens=64 if args.max_new_tokens is None else args.max_new_tokens,
                  seed=0 if args.seed is None else args.seed, draft=args.draft, params=params,
                  stop=args.stop, chat=args.chat, system_prompt=args.system_prompt,
                  load_kwargs=_load_kwargs(args), force=args.force, watch=_watch(args))
    trace = run.finish()
    if args.json:
        print(trace.to_json())
    else:
        print(trace.prompt + trace.text)
        s = trace.stats
        print(f"\n[{trace.decoder}] {s['new_tokens']} tokens, {s['target_forwards']} target forwards "
              f"({s['tokens_per_target_forward']} tokens/forward), {s['wall_s']} s, "
              f"finish: {s['finish_reason']}", file=sys.stderr)
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from playground.api import plan_compare, prepare_lanes

    plan = plan_compare(args.preset, model=args.model, prompt=args.prompt, seed=args.seed,
                        max_new_tokens=args.max_new_tokens, chat=True if args.chat else None,
                        system_prompt=args.system_prompt)
    traces = [run.finish() for run in prepare_lanes(plan, load_kwargs=_load_kwargs(args), watch=_watch(args))]
    if args.json:
        print(json.dumps([t.to_dict() for t in traces], ensure_ascii=False))
    else:
        for lane, t in enumerate(traces, start=1):  # lanes numbered from 1, as on the page
            s = t.stats
            print(f"== lane {lane}: {t.decoder}: {s['new_tokens']} tokens, {s['target_forwards']} target forwards, "
                  f"{s['wall_s']} s\n{t.prompt}{t.text}\n")
    return 0


def _cmd_list_decoders(args: argparse.Namespace) -> int:
    from playground.api import list_decoders

    specs = list_decoders(args.family)
    if args.json:
        print(json.dumps(specs, ensure_ascii=False))
        return 0
    for s in specs:
        knobs = ", ".join(f"{k}={v['default']}" for k, v in s["params"].items())
        flags = (" [needs draft]" if s["needs_draft"] else "") + (" [lossless]" if s["lossless"] else "")
        print(f"{s['family']:<12} {s['name']:<18} {s['kind']:<9}{flags}  {knobs}")
    return 0


def _cmd_list_models(args: argparse.Namespace) -> int:
    from playground.core.models import list_models

    models = list_models()
    if args.json:
        print(json.dumps(models))
        return 0
    for m in models:
        print(f"{m['name']:<40} {m['source']:<8} {m['kind'] or '?':<10} {'' if m['available'] else '(missing)'}")
    return 0


def _cmd_list_presets(args: argparse.Namespace) -> int:
    presets = list_presets()
    if args.json:
        print(json.dumps(presets, ensure_ascii=False))
        return 0
    for p in presets:
        print(f"{p['name']:<28} {p['title']}")
    return 0


COMMANDS = {"generate": _cmd_generate, "compare": _cmd_compare, "list-decoders": _cmd_list_decoders,
            "list-models": _cmd_list_models, "list-presets": _cmd_list_presets}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``playground`` console script; returns the exit status."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        if args.command in COMMANDS:
            return COMMANDS[args.command](args)
        if getattr(args, "_missing", False):
            raise PlaygroundError(f"`{args.command}` is not available in this build")
        return int(importlib.import_module(args._module).run(args) or 0)
    except PlaygroundError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
