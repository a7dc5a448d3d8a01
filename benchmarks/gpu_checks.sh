#!/usr/bin/env bash
# The GPU wire (ops.Send/Receive over NCCL) against one GPU: with the same seed and flags,
# a pipeline must give the single GPU's weights and its loss at every step.
#   bash benchmarks/gpu_checks.sh [OUT_DIR [--layout PxD] [--model gpt] [--one-graph] [--defer-wgrad] [--precision fp16] [SCHEDULE...]]
# (P x D GPUs and msrun.) Default: 2 stages (2x1), the 3 x 256 MLP, every schedule.
# --layout PxD: P stages x D replicas (their gradients all-reduced over NCCL); with P > 2
# the model is deepened to 2P layers (the V schedules' two chunks per rank) and the batch
# split into 2P micro-batches (DualPipeV's least). --model gpt trains the GPT
# example instead (2 blocks of width 64: a (hidden, int32 mask) tuple between the stages,
# sequences of two lengths, the (sum, count) token loss, the head tied to the embedding,
# Adam). --one-graph runs the pipelines as one graph per step, against one GPU's one graph
# (one GPU's loop against its graph is printed too, not checked). On GPUs the GPT is not
# bit for bit even run twice on one GPU (MindSpore's kernels for it are not deterministic:
# docs/performance.md), so its check shows that spread; --defer-wgrad defers the weight
# gradients of both; --precision fp16 trains both in float16 with a loss scale. Without them
# both run the per-action loop with W per micro-batch (pipe chooses nothing here).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu-checks}; shift || true
GRAPH=--no-one-graph DEFER=--no-defer-wgrad PRECISION=""
MODEL=mlp STAGES=2 REPLICAS=1
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --layout) [[ "${2:-}" =~ ^([1-9][0-9]*)x([1-9][0-9]*)$ ]] && [ $((BASH_REMATCH[1] * BASH_REMATCH[2])) -ge 2 ] \
        || { echo "error: --layout ${2:-}: use PxD (stages x replicas) of 2 or more GPUs, e.g. 2x2" >&2; exit 2; }
      STAGES=${BASH_REMATCH[1]} REPLICAS=${BASH_REMATCH[2]}; shift 2 ;;
    --model) [[ "${2:-}" =~ ^(mlp|gpt)$ ]] || { echo "error: --model ${2:-}: use mlp or gpt" >&2; exit 2; }
      MODEL=$2; shift 2 ;;
    --one-graph) GRAPH=--one-graph; shift ;;
    --defer-wgrad) DEFER=$1; shift ;;
    --precision) [[ "${2:-}" =~ ^(fp32|fp16)$ ]] || { echo "error: --precision ${2:-}: use fp32 or fp16" >&2; exit 2; }
      PRECISION="--precision $2"; shift 2 ;;
    *) echo "error: unknown option $1 (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
if [ "$MODEL" = gpt ]; then            # the embedding, L blocks, the head
  TRAIN=examples/gpt/train.py
  FLAGS="--layers $((STAGES > 2 ? 2 * STAGES - 2 : 2)) --width 64 --batch-size 16 --sample 0"
else                                   # L hidden layers and the output layer
  TRAIN=examples/mnist/train.py
  FLAGS="--data synthetic --layers $((STAGES > 2 ? 2 * STAGES - 1 : 3)) --hidden 256 --batch-size 64"
fi
FLAGS="--device GPU $FLAGS --micro-batches $((STAGES > 2 ? 2 * STAGES : 4)) --steps 20 --log-every 1 --seed 0 $PRECISION $DEFER"
WORKERS=$((STAGES * REPLICAS)) LAYOUT="--stages $STAGES --data-parallel $REPLICAS"
ALL=$(python -c "from pipe.schedules import SCHEDULES; print(*SCHEDULES)")
SCHEDULES=${*:-$ALL}
for schedule in $SCHEDULES; do
  [[ " $ALL " == *" $schedule "* ]] || { echo "error: unknown schedule '$schedule': use one of $ALL" >&2; exit 2; }
done
mkdir -p "$OUT" 2>/dev/null || { echo "error: $OUT: cannot make it: give a folder you can write" >&2; exit 2; }
echo "\$ python $TRAIN $FLAGS --no-one-graph --save $OUT/single"
python $TRAIN $FLAGS --no-one-graph --save "$OUT/single" > "$OUT/single.log" 2>&1
grep -E "^(config|step|held|saved)" "$OUT/single.log" | sed -n '1p;$p'
REF=single
if [ "$GRAPH" = --one-graph ]; then   # the reference runs as the pipelines do
  REF=single-graph
  echo "\$ python $TRAIN $FLAGS --one-graph --save $OUT/$REF"
  python $TRAIN $FLAGS --one-graph --save "$OUT/$REF" > "$OUT/$REF.log" 2>&1
  echo "one GPU, its loop against its one graph (not checked):"
  python benchmarks/compare_runs.py "$OUT/single/model.ckpt" "$OUT/single.log" \
    "$OUT/$REF/model.ckpt" "$OUT/$REF.log" | sed -n 1,2p || true
fi
free_port() {  # a port no one listens on now, chosen by the OS
  python -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
}
differ=""                              # every schedule runs; those that differ are named at the end
for schedule in $SCHEDULES; do
  echo "\$ msrun --worker_num=$WORKERS --local_worker_num=$WORKERS --join=True $TRAIN $FLAGS $LAYOUT --schedule $schedule $GRAPH --save $OUT/$schedule"
  msrun --worker_num=$WORKERS --local_worker_num=$WORKERS --master_port="$(free_port)" --log_dir="$OUT/logs-$schedule" \
    --join=True $TRAIN $FLAGS $LAYOUT --schedule $schedule $GRAPH --save "$OUT/$schedule" > /dev/null 2>&1 \
    || { tail -n 30 "$OUT/logs-$schedule/worker_0.log"; exit 1; }
  grep -E "^(config|held|saved)" "$OUT/logs-$schedule/worker_0.log"
  python benchmarks/compare_runs.py "$OUT/$REF/model.ckpt" "$OUT/$REF.log" \
    "$OUT/$schedule/model.ckpt" "$OUT/logs-$schedule/worker_0.log" || differ="$differ $schedule"
done
[ -z "$differ" ] || { echo "differ from one GPU:$differ"; exit 1; }
