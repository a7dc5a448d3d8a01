#!/usr/bin/env bash
# The GPT benchmark on one GPU, one precision per call: MindSpore's own step and pipe's
# defaults at M = 1 and 4, and MindSpore's step accumulating 4 micro-batches (`base`), or
# each mode pipe offers at M = 4 (`modes`: one graph or the loop, W deferred or per
# micro-batch). More flags go to every run (--tf32).
#   bash benchmarks/gpt_sweep.sh fp32 base RESULTS.jsonl [--tf32]
#   (MFU's peak on an H100/H200: 67 TFLOPS fp32, 495 TF32, 989 fp16)
set -u
precision=$1 which=$2 results=$3; shift 3
peak=$([ "$precision" = fp32 ] && echo 67 || echo 989)
[[ " $* " == *" --tf32 "* ]] && peak=495
run() { timeout 280 python benchmarks/gpt_benchmark.py --precision "$precision" --peak-tflops "$peak" \
          --results "$results" "$@" $EXTRA 2>&1 | grep -v "^pipe chose" | tail -n 2; }
EXTRA="$*"
if [ "$which" = base ]; then
  run --impl mindspore
  run --impl pipe
  run --impl pipe --micro-batches 4
  run --impl mindspore --micro-batches 4
else
  run --impl pipe --micro-batches 4 --one-graph --no-defer-wgrad
  run --impl pipe --micro-batches 4 --one-graph --defer-wgrad
  run --impl pipe --micro-batches 4 --no-one-graph --no-defer-wgrad
  run --impl pipe --micro-batches 4 --no-one-graph --defer-wgrad
fi
