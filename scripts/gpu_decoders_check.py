"""Every registered decoder on one device (CUDA by default), on the bundled models.

``python scripts/gpu_decoders_check.py [--device cuda] [--tokens 12] [--out FILE.json]``

For each decoder: run it once with its default knobs (a draft where it needs one) on the
device, and — for the decoders that are deterministic at their defaults — compare the output
ids with the same run on the CPU. A failure prints its whole traceback, so a device-placement
bug (a tensor made on the CPU and mixed with CUDA ones) shows the line that made it. Exit
status 1 if any decoder failed. Written to be run on a GPU machine; on a CPU-only machine
``--device cpu`` checks the script itself.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import decoders
from playground.engine import prepare

PROMPT = "KING HENRY.\nOnce more unto the breach, dear friends, once more;\n"
TARGET, DRAFT, DIFFUSION = "tiny-shakespeare", "tiny-shakespeare-draft", "tiny-shakespeare-diffusion"
# decoders whose defaults need something of the prompt or something to steer by
_KNOBS = {"smc": {"keywords": "the"}, "cad": {"separator": "\n"}, "constrained_beam": {"force_words": "breach"}}


def _request(cls: type, device: str) -> dict:
    model = DIFFUSION if cls.kind == "diffusion" else TARGET
    draft = None
    if cls.needs_draft:
        draft = DIFFUSION if getattr(cls, "draft_kind", "causal") == "diffusion" else DRAFT
    return dict(model=model, decoder=cls.name, prompt=PROMPT, seed=0, draft=draft,
                load_kwargs={"device": device})


def run_one(cls: type, device: str, tokens: int) -> list[int]:
    """The output ids of one run of ``cls`` on ``device``."""
    req = _request(cls, device)
    params = {k: v for k, v in _KNOBS.get(cls.name, {}).items() if k in cls.params}
    run = prepare(max_new_tokens=tokens, params=params, **req)
    trace = run.finish()
    return list(trace.output_ids)


def main(argv: list[str] | None = None) -> int:
    """Run the check; print one line per decoder and a summary."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokens", type=int, default=12)
    p.add_argument("--out")
    a = p.parse_args(argv)
    results = []
    for cls in sorted(decoders.all_decoders(), key=lambda c: (c.family, c.name)):
        t0 = time.perf_counter()
        row = {"decoder": cls.name, "family": cls.family}
        try:
            ids = run_one(cls, a.device, a.tokens)
            row["ok"] = True
            row["tokens"] = len(ids)
            if a.device != "cpu":
                try:
                    row["same_as_cpu"] = run_one(cls, "cpu", a.tokens) == ids
                except Exception as e:  # noqa: BLE001 - report, keep going
                    row["same_as_cpu"] = f"cpu run failed: {type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - report every decoder
            row["ok"] = False
            row["error"] = f"{type(e).__name__}: {e}".split("\n")[0]
            print(f"--- {cls.name} failed on {a.device}:", file=sys.stderr)
            traceback.print_exc()
        row["s"] = round(time.perf_counter() - t0, 2)
        results.append(row)
        print(json.dumps(row), flush=True)
    failed = [r["decoder"] for r in results if not r["ok"]]
    print(f"{len(results) - len(failed)}/{len(results)} decoders ran on {a.device}; failed: {failed or 'none'}")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
