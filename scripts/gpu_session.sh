#!/usr/bin/env bash
# One GPU session (issue 15 item 5, issue 17): train the three bundled tiny models on CUDA with
# the `gpu` recipe of playground/train_tiny.py, evaluate them (cards + eval.json inside each
# model directory), then run `playground bench --suite gpu`. Everything lands in $OUT:
#
#   session.log                         the whole console output (tee'd as it runs)
#   tiny-shakespeare.tar.gz             one model directory each, ready to unpack into
#   tiny-shakespeare-draft.tar.gz       assets/models/ (config, model.safetensors, tokenizer,
#   tiny-shakespeare-diffusion.tar.gz   README.md card, eval.json) — only for stages that succeeded
#   targets.json                        issue 17's targets, met or not (scripts/tiny_targets.py)
#   bench_gpu.md                        the gpu bench section (for docs/benchmarks.md)
#
# Every stage runs under `timeout`, sized from a total budget (GPU_SESSION_BUDGET seconds,
# default 500), so one stage overrunning cannot cost the others their outputs. Models train
# first: they are the part that cannot be redone without a GPU.
#
#   OUT=/tmp/out bash scripts/gpu_session.sh              # on the GPU machine
#   GPU_SESSION_SMOKE=1 OUT=/tmp/out bash scripts/gpu_session.sh   # CPU, toy sizes, ~1-2 min
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-/tmp/gpu-session-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

SMOKE=${GPU_SESSION_SMOKE:-0}
BUDGET=${GPU_SESSION_BUDGET:-500}
[ "$SMOKE" = 1 ] && BUDGET=${GPU_SESSION_BUDGET:-1500}  # a shared CPU is slow to even import
WORK=${GPU_SESSION_WORK:-/tmp/tiny-gpu}
START=$SECONDS
if [ "$SMOKE" = 1 ]; then
  DEVICE=cpu; TRAIN_EXTRA=(--smoke --threads 2); BENCH_EXTRA=(--quick); export PLAYGROUND_BENCH_GPU_CPU=1
else
  DEVICE=cuda; TRAIN_EXTRA=(); BENCH_EXTRA=(--repeats 2)
fi

left() { echo $(( BUDGET - (SECONDS - START) )); }
# stage_timeout CAP RESERVE: CAP seconds, or less so that RESERVE seconds remain for what follows
stage_timeout() { local t=$(( $(left) - $2 )); [ "$t" -gt "$1" ] && t=$1; [ "$t" -lt 5 ] && t=5; echo "$t"; }
stamp() { echo "=== [$(date -u +%H:%M:%S), +$((SECONDS - START))s] $*"; }

main() {
# (a) the project: run from the tree (no install needed); bitsandbytes travels as a trimmed
# wheel (.whl/, only the CUDA 13 and CPU libraries) because the image has none.
stamp "setup"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import bitsandbytes" >/dev/null 2>&1; then
  for z in .whl/bitsandbytes-*.zip .whl/bitsandbytes-*.whl; do
    [ -f "$z" ] || continue
    mkdir -p /tmp/site && python3 -m zipfile -e "$z" /tmp/site && export PYTHONPATH="$PYTHONPATH:/tmp/site"
    echo "bitsandbytes unpacked from $z"
  done
fi
python3 - <<'EOF' || true
import torch, transformers
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "", "| transformers", transformers.__version__)
try:
    import bitsandbytes; print("bitsandbytes", bitsandbytes.__version__)
except Exception as e:
    print("bitsandbytes unavailable:", type(e).__name__, e)
EOF
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# the model directories start as copies of the bundled ones (tokenizer shared, and the draft
# distils from the previous target should the new target fail)
rm -rf "$WORK" /tmp/tiny-gpu-ckpt
mkdir -p "$WORK"
cp -r assets/models/tiny-shakespeare assets/models/tiny-shakespeare-draft \
      assets/models/tiny-shakespeare-diffusion "$WORK"/

# (b) training, one stage per process; caps include corpus encoding and the CPU evaluation
declare -A CAP=([target]=150 [draft]=140 [diffusion]=160)
declare -A RESERVE=([target]=330 [draft]=230 [diffusion]=60)
declare -A NAME=([target]=tiny-shakespeare [draft]=tiny-shakespeare-draft [diffusion]=tiny-shakespeare-diffusion)
for stage in target draft diffusion; do
  t=$(stage_timeout "${CAP[$stage]}" "${RESERVE[$stage]}")
  stamp "train $stage (timeout ${t}s)"
  if timeout -k 10 "$t" python3 -m playground.train_tiny --device "$DEVICE" --recipe gpu \
       --only "$stage" --out "$WORK" --ckpt-dir /tmp/tiny-gpu-ckpt --ckpt-every 500 "${TRAIN_EXTRA[@]}"; then
    rm -f "$WORK/${NAME[$stage]}/.gitattributes"
    tar -czf "$OUT/${NAME[$stage]}.tar.gz" -C "$WORK" "${NAME[$stage]}" \
      && ls -la "$OUT/${NAME[$stage]}.tar.gz"
  else
    echo "!!! train $stage failed or timed out (exit $?); no tarball for it"
  fi
done
stamp "targets"
python3 scripts/tiny_targets.py "$WORK" "$OUT/targets.json" || true

# (c) the gpu bench, with what is left (a little kept for the end)
t=$(stage_timeout 240 15)
stamp "bench --suite gpu (timeout ${t}s)"
timeout -k 10 "$t" python3 -m playground bench --suite gpu --no-write "${BENCH_EXTRA[@]}" \
  > "$OUT/bench_gpu.md" || echo "!!! bench failed or timed out (exit $?); partial output in bench_gpu.md"
cat "$OUT/bench_gpu.md"
stamp "done"
ls -la "$OUT"
}

main 2>&1 | tee -a "$OUT/session.log"
