"""Check trained tiny models against issue 17's targets; print a table, write it as JSON.

    python scripts/tiny_targets.py MODELS_DIR [SUMMARY.json]

Reads each model's eval.json (written by `playground train-tiny`, figures on the validation
split) and model.safetensors sizes. Exit status 0 whatever the outcome: it reports, the
integrator decides.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NAMES = {"target": "tiny-shakespeare", "draft": "tiny-shakespeare-draft",
         "diffusion": "tiny-shakespeare-diffusion"}
MAX_FILE_MB, MAX_TOTAL_MB = 15.0, 60.0


def check(models: Path) -> dict:
    """Figures, sizes and a pass/fail per target of issue 17."""
    ev = {}
    for stage, name in NAMES.items():
        path = models / name / "eval.json"
        ev[stage] = json.loads(path.read_text()) if path.exists() else None
    sizes = {name: (models / name / "model.safetensors").stat().st_size / 1e6
             for name in NAMES.values() if (models / name / "model.safetensors").exists()}
    checks: list[dict] = []

    def add(what: str, value: float | None, ok: bool | None) -> None:
        checks.append(dict(target=what, value=value, met=ok))

    t = ev["target"]
    ppl = t["figures"]["val_perplexity"] if t else None
    add("target perplexity <= 55", ppl, ppl is not None and ppl <= 55)
    d = ev["draft"]
    if d:
        agree = d["figures"]["agreement_top1"]
        ratio = d["training"].get("size_ratio")
        add("draft top-1 agreement >= 0.62", agree, agree >= 0.62)
        add("draft >= 5x smaller", ratio, ratio is not None and ratio >= 5)
    else:
        add("draft", None, False)
    f = ev["diffusion"]["figures"] if ev["diffusion"] else None
    for r in (15, 50, 90):
        gap = f[f"masked_acc_{r}"] - f[f"unigram_acc_{r}"] if f else None
        add(f"diffusion masked acc >= unigram + 0.05 at {r}%", gap, gap is not None and gap >= 0.05)
    for name, mb in sizes.items():
        add(f"{name}/model.safetensors <= {MAX_FILE_MB:g} MB", round(mb, 2), mb <= MAX_FILE_MB)
    total = sum(sizes.values())
    add(f"all three <= {MAX_TOTAL_MB:g} MB", round(total, 2), total <= MAX_TOTAL_MB)
    return dict(checks=checks, figures={k: v["figures"] if v else None for k, v in ev.items()},
                training={k: {x: v["training"].get(x) for x in
                              ("steps", "best_step", "train_seconds", "parameters", "hardware")}
                          if v else None for k, v in ev.items()})


def main(argv: list[str]) -> int:
    """Print the checks; write them to argv[1] when given."""
    result = check(Path(argv[0]))
    for c in result["checks"]:
        v = "-" if c["value"] is None else (f"{c['value']:.4f}" if isinstance(c["value"], float)
                                             else str(c["value"]))
        print(f"{'MET ' if c['met'] else 'MISS'} {c['target']}: {v}")
    if len(argv) > 1:
        Path(argv[1]).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
