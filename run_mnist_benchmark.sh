#!/usr/bin/env bash
# What pipeline parallelism buys on this machine: pipe's schedules on every layout that fits,
# next to one device and to MindSpore's built-in pipeline, for a small and a compute-bound MLP.
#
#   ./run_mnist_benchmark.sh                       # the whole sweep
#   ./run_mnist_benchmark.sh --model large --layout 2x1 --schedule 1f1b
#
# Options: --model small|large|all  --layout PxD|all  --schedule NAME|all
#          --impl pipe|pipe-graph|builtin|all  (pipe-graph: each step as one compiled graph)
#          --defer-wgrad (pipe's weight gradients once per step, over all micro-batches)
#          --precision fp32|fp16 (fp16: float16 compute, float32 weights, loss scaling;
#                                 the built-in gets its layers cast alike, with no loss scale)
#          --steps N  --devices N  --out DIR  --trace (record a Chrome trace per pipe run)
#          --repeats R (run each configuration R times; the table shows the median run)
# GPUs are found with nvidia-smi and launched with msrun; without GPUs it runs on CPU processes
# (2 unless --devices) with mpiexec. Prints one table; writes DIR/results.{jsonl,csv,json}.
set -euo pipefail
cd "$(dirname "$0")"

MODEL=all LAYOUT=all SCHEDULE=all IMPL=all STEPS=20 DEVICES="" OUT="" TRACE=0 DEFER="" PRECISION=fp32 REPEATS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;       --layout) LAYOUT=$2; shift 2 ;;
    --schedule) SCHEDULE=$2; shift 2 ;; --impl) IMPL=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;       --devices) DEVICES=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;           --trace) TRACE=1; shift ;;
    --defer-wgrad) DEFER=--defer-wgrad; shift ;;
    --precision) PRECISION=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

bad() { echo "error: $1" >&2; exit 2; }   # one line naming the value and the fix
case "$MODEL" in small|large|all) ;; *) bad "--model $MODEL: use small, large or all" ;; esac
case "$IMPL" in pipe|pipe-graph|builtin|all) ;; *) bad "--impl $IMPL: use pipe, pipe-graph, builtin or all" ;; esac
case "$PRECISION" in fp32|fp16) ;;
  bf16) bad "--precision bf16: MindSpore 2.10 has no bfloat16 kernels on CPU or GPU; use fp16 or fp32" ;;
  *) bad "--precision $PRECISION: use fp32 or fp16" ;; esac
NAMES=$(python -c "from pipe.schedules import SCHEDULES; print(*SCHEDULES)")
[[ " $NAMES all " == *" $SCHEDULE "* ]] || bad "--schedule $SCHEDULE: use one of $NAMES, or all"
[[ "$LAYOUT" =~ ^([1-8]x[1-8]|all)$ ]] || bad "--layout $LAYOUT: use PxD (stages x replicas, e.g. 2x1) or all"
[[ "$STEPS" =~ ^[1-9][0-9]*$ ]] || bad "--steps $STEPS: use a positive integer"
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || bad "--repeats $REPEATS: use a positive integer"
[[ -z "$DEVICES" || "$DEVICES" =~ ^[1-9][0-9]*$ ]] || bad "--devices $DEVICES: use a positive integer"

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  DEVICE=GPU; FOUND=$(nvidia-smi -L | wc -l)
else
  DEVICE=CPU; FOUND=2
fi
DEVICES=${DEVICES:-$FOUND}
if [ "$LAYOUT" != all ]; then   # a layout the devices cannot hold: say so, before any run
  NEED=$(( ${LAYOUT%x*} * ${LAYOUT#*x} ))
  [ "$NEED" -le "$DEVICES" ] || bad "--layout $LAYOUT needs $NEED devices, and there are $DEVICES ($DEVICE): use a layout of at most $DEVICES, or --devices N"
fi
OUT=${OUT:-runs/benchmark-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT/logs"
RESULTS=$OUT/results.jsonl
echo "device: $DEVICE x $DEVICES; results in $OUT"

COUNTING=0 TOTAL=0 DONE=0 T0=$(date +%s)
launch() {  # launch N WHAT ARGS...: one configuration on N processes, REPEATS times, after its progress line
  local n=$1 what=$2; shift 2
  if [ "$COUNTING" = 1 ]; then TOTAL=$((TOTAL + 1)); return 0; fi
  DONE=$((DONE + 1))
  local t=$(( $(date +%s) - T0 ))
  printf '  [%d/%d, %d:%02d elapsed] %s\n' "$DONE" "$TOTAL" $((t / 60)) $((t % 60)) "$what"
  local r
  for ((r = 0; r < REPEATS; r++)); do run "$n" "$@" --precision "$PRECISION" --repeat $r; done
}
run() {  # run N ARGS...: benchmark.py on N processes
  local n=$1; shift
  if [ "$n" -eq 1 ]; then
    python benchmarks/benchmark.py --device "$DEVICE" --results "$RESULTS" "$@"
  elif [ "$DEVICE" = CPU ]; then
    mpiexec -n "$n" python benchmarks/benchmark.py --device CPU --results "$RESULTS" "$@"
  else
    msrun --worker_num="$n" --local_worker_num="$n" --master_port=$((8100 + RANDOM % 800)) \
      --log_dir="$OUT/logs" --join=True benchmarks/benchmark.py --device "$DEVICE" \
      --results "$RESULTS" "$@" > "$OUT/logs/last.out" 2>&1 || { echo "  failed: $*"; tail -n 5 "$OUT"/logs/worker_0.log; }
  fi
}
say() { [ "$COUNTING" = 1 ] || echo "$@"; }

wanted() { [ "$1" = all ] || [ "$1" = "$2" ]; }
PIPES=""                  # pipe's runs: per action (pipe) and as one graph per step (pipe-graph)
wanted "$IMPL" pipe && PIPES="$PIPES pipe"
wanted "$IMPL" pipe-graph && PIPES="$PIPES pipe-graph"
flags_of() { echo $DEFER; if [ "$1" = pipe-graph ]; then echo --one-graph; fi; }

sweep() {  # every wanted run, in order (run once counting, once for real)
  for model in small large; do
    wanted "$MODEL" "$model" || continue
    if [ $model = small ]; then SIZE="--layers 8 --hidden 1024 --batch-size 64"
    else SIZE="--layers 16 --hidden 8192 --inputs 8192 --batch-size 1024"; fi
    say "== $model MLP: $SIZE"
    if wanted "$LAYOUT" 1x1; then
      for impl in $PIPES; do
        launch 1 "$impl 1x1 M=1" $SIZE --stages 1 --micro-batches 1 $(flags_of $impl)
        done_m=" "
        for P in 2 4 8; do  # one device with each pipeline's M: the pipeline-efficiency reference
          [ $P -le "$DEVICES" ] || continue
          if [ $model = small ]; then M=4; else M=$((4 * P)); fi
          case "$done_m" in *" $M "*) continue ;; esac
          done_m="$done_m$M "
          launch 1 "$impl 1x1 M=$M" $SIZE --stages 1 --micro-batches $M $(flags_of $impl)
        done
      done
      wanted "$IMPL" builtin && launch 1 "builtin 1x1" $SIZE --impl builtin --stages 1 --micro-batches 1
    fi
    for P in 1 2 4 8; do for D in 1 2 4 8; do
      n=$((P * D))
      [ $n -gt 1 ] && [ $n -le "$DEVICES" ] && wanted "$LAYOUT" "${P}x${D}" || continue
      if [ $model = small ]; then M=4; else M=$((4 * P)); fi
      if [ $P -eq 1 ]; then
        for impl in $PIPES; do
          launch $n "$impl 1x$D" $SIZE --data-parallel $D --micro-batches 1 $(flags_of $impl)
        done
        continue
      fi
      for impl in $PIPES; do for schedule in $NAMES; do
        wanted "$SCHEDULE" $schedule || continue
        if [ $schedule = dualpipe-v ] && [ $M -lt $((2 * P)) ]; then
          say "  $impl ${P}x${D} dualpipe-v skipped: it needs M >= 2P"; continue; fi
        extra=""; [ $TRACE = 1 ] && extra="--trace $OUT/trace-$model-${P}x${D}-$schedule-$impl.json"
        launch $n "$impl ${P}x${D} $schedule M=$M" $SIZE --stages $P --data-parallel $D \
          --schedule $schedule --micro-batches $M --steps "$STEPS" $extra $(flags_of $impl)
      done; done
      if [ "$DEVICE" != CPU ] && wanted "$IMPL" builtin; then
        launch $n "builtin ${P}x${D} M=$M" $SIZE --impl builtin --stages $P --data-parallel $D \
          --micro-batches $M --steps "$STEPS"
      fi
    done; done
  done
}
COUNTING=1; sweep; COUNTING=0; sweep
python benchmarks/report.py "$RESULTS"
