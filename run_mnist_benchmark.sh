#!/usr/bin/env bash
# What pipeline parallelism buys on this machine: pipe next to one device, MindSpore's built-in
# pipeline and torch.distributed.pipelining (when torch is importable), on an MLP (compute-bound
# on GPUs, small on CPU) and the GPT example's model (GPT-2-small-sized on GPUs, scaled down on
# CPU, pipelined on 2, 4, 8 devices up to all) beside MindSpore's own step and torch's. With no
# flags: the headline table, each figure the median of 3 windows.
#
#   ./run_mnist_benchmark.sh                       # headline (its time: the README's Results)
#   ./run_mnist_benchmark.sh --all                 # every layout, schedule and implementation
#   ./run_mnist_benchmark.sh --model large --layout 2x1 --schedule 1f1b   (a part of --all)
#
# Options: --model small|large|gpt|all  --all (MLPs)  --layout PxD|all  --schedule NAME|all
#          --impl pipe|pipe-graph|builtin|all  (pipe: the per-action loop; pipe-graph: each
#                                               step as one compiled graph)
#          --defer-wgrad / --no-defer-wgrad (W once per step over all micro-batches, or per
#                                            micro-batch; default: pipe chooses)
#          --precision fp32|fp16 (fp16: float16 compute, float32 weights, loss scaling; on
#                                 one GPU MindSpore's step is its own O2 recipe, loss scaled
#                                 alike; its pipeline gets its layers cast, no loss scale)
#          --tf32 (GPU: float32 products in TF32, pipe's and MindSpore's alike)
#          --steps N (per window; default 10, the GPT's 5)  --repeats R (windows; the table
#                                            shows the median)
#          --devices N  --out DIR  --trace (record a Chrome trace per run of the loop)
#          --gpt-batch 64|256 (GPUs: the GPT's global batch; 64 in 4P micro-batches, or 256 in
#                              16 of 16 on every layout; one GPU of 120 GiB or more, MindSpore
#                              and torch alike, trains it whole, its fastest way)
#          --one-at-a-time (headline: each launch starts once the one before has ended; by
#                           default they start together, each on its own devices, compile side
#                           by side, then are timed one at a time: all of them on 4 or more
#                           GPUs or GPUs of 100 GiB, else each model's; GPUs under 64 GiB: one
#                           at a time)
# GPUs are found with nvidia-smi and launched with msrun; without GPUs it runs on CPU processes
# (2 unless --devices) with mpiexec. Prints one table; writes DIR/results.{jsonl,csv,json,png}
# (DIR: --out, else runs/benchmark-DATE-TIME).
set -euo pipefail
cd "$(dirname "$0")"

MODEL=all LAYOUT=all SCHEDULE=all IMPL=all STEPS="" DEVICES="" OUT="" TRACE=0 DEFER="" PRECISION=fp32
TF32="" GBATCH=64
REPEATS=3 HEADLINE=1 SIDE=1
bad() { echo "error: $1" >&2; exit 2; }   # one line naming the value and the fix
value() { [ $# -ge 2 ] || bad "$1 needs a value (see --help)"; }   # a flag that takes one
while [ $# -gt 0 ]; do
  case "$1" in
    --model) value "$@"; MODEL=$2; shift 2 ;;                 --all) HEADLINE=0; shift ;;
    --layout) value "$@"; LAYOUT=$2; HEADLINE=0; shift 2 ;;
    --schedule) value "$@"; SCHEDULE=$2; HEADLINE=0; shift 2 ;;
    --impl) value "$@"; IMPL=$2; HEADLINE=0; shift 2 ;;
    --steps) value "$@"; STEPS=$2; shift 2 ;;
    --devices) value "$@"; DEVICES=$2; shift 2 ;;
    --out) value "$@"; OUT=$2; shift 2 ;;                     --trace) TRACE=1; shift ;;
    --defer-wgrad|--no-defer-wgrad) DEFER=$1; shift ;;
    --precision) value "$@"; PRECISION=$2; shift 2 ;;         --tf32) TF32=--tf32; shift ;;
    --repeats) value "$@"; REPEATS=$2; shift 2 ;;             --one-at-a-time) SIDE=0; shift ;;
    --gpt-batch) value "$@"; GBATCH=$2; shift 2 ;;
    -h|--help) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) bad "unknown option $1 (see --help)" ;;
  esac
done

GSTEPS=${STEPS:-5} STEPS=${STEPS:-10}     # steps per window: the GPT's are long
case "$MODEL" in small|large|gpt|all) ;; *) bad "--model $MODEL: use small, large, gpt or all" ;; esac
case "$IMPL" in pipe|pipe-graph|builtin|all) ;; *) bad "--impl $IMPL: use pipe, pipe-graph, builtin or all" ;; esac
case "$PRECISION" in fp32|fp16) ;;
  bf16) bad "--precision bf16: MindSpore 2.10 has no bfloat16 kernels on CPU or GPU; use fp16 or fp32" ;;
  *) bad "--precision $PRECISION: use fp32 or fp16" ;; esac
NAMES=$(python -c "from pipe.schedules import SCHEDULES; print(*SCHEDULES)")
[[ " $NAMES all " == *" $SCHEDULE "* ]] || bad "--schedule $SCHEDULE: use one of $NAMES, or all"
[[ "$LAYOUT" =~ ^[0-9]+x[0-9]+$|^all$ ]] || bad "--layout $LAYOUT: use PxD (stages x replicas, e.g. 2x1) or all"
[[ "$LAYOUT" =~ ^[1-8]x[1-8]$|^all$ ]] || bad "--layout $LAYOUT: P and D run from 1 to 8 (stages x replicas, e.g. 2x1)"
[[ "$STEPS" =~ ^[1-9][0-9]*$ ]] || bad "--steps $STEPS: use a positive integer"
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || bad "--repeats $REPEATS: use a positive integer"
[[ -z "$DEVICES" || "$DEVICES" =~ ^[1-9][0-9]*$ ]] || bad "--devices $DEVICES: use a positive integer"
[[ "$GBATCH" =~ ^(64|256)$ ]] || bad "--gpt-batch $GBATCH: use 64 or 256"

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  DEVICE=GPU; FOUND=$(nvidia-smi -L | wc -l)
else
  DEVICE=CPU; FOUND=2
fi
DEVICES=${DEVICES:-$FOUND}
[ "$GBATCH" = 64 ] || [ "$DEVICE" = GPU ] || bad "--gpt-batch $GBATCH is for GPUs; on CPU the GPT is scaled down to a batch of 16: drop --gpt-batch"
[ -z "$TF32" ] || [ "$DEVICE" = GPU ] || bad "--tf32 is an NVIDIA GPU's matrix-product mode, and this machine runs on CPU, which multiplies in float32 whatever it is set to: drop --tf32"
if [ "$LAYOUT" != all ]; then   # a layout the devices cannot hold: say so, before any run
  NEED=$(( ${LAYOUT%x*} * ${LAYOUT#*x} ))
  [ "$NEED" -le "$DEVICES" ] || bad "--layout $LAYOUT needs $NEED devices, and there are $DEVICES ($DEVICE): use a layout of at most $DEVICES, or --devices N"
fi
OUT=${OUT:-runs/benchmark-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT/logs" 2>/dev/null || bad "--out $OUT: cannot make $OUT/logs: give a folder you can write"
RESULTS=$OUT/results.jsonl
exec 3>&2                # (the trap may run inside a launch's redirection: it writes to 3)
stop_launches() {  # each background launch's launcher gets SIGINT, as from Ctrl-C: msrun then
  for pid in $(jobs -pr); do pkill -INT -P "$pid"; kill "$pid"; done 2>/dev/null || true
}                  # kills its workers (SIGTERM would end msrun alone, its workers left running)
interrupted() {  # Ctrl-C reaches every launch too (one process group): one line, exit code 130
  trap '' INT TERM
  stop_launches
  wait 2>/dev/null || true
  echo "interrupted after $DONE of $TOTAL launches started; what ended is in $RESULTS" >&3
  exit 130
}
trap interrupted INT TERM
echo "device: $DEVICE x $DEVICES; results in $OUT"
if [ "$DEVICE" = CPU ]; then
  echo "(CPU: the $DEVICES processes share this machine's cores: these runs show the schedules and that"
  echo " every layout trains the same model, not what pipelining gains; that needs a GPU per stage.)"
fi
ONE_BATCH=1   # side by side: the headline's launches in one batch; on fewer than 4 GPUs of
if [ "$DEVICE" = GPU ]; then   # under 100 GiB one batch per model (one batch peaks at 74 GiB on 2)
  MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | sort -n | head -n 1)
  [ "$DEVICES" -ge 4 ] || [ "${MEM:-0}" -ge 102400 ] || ONE_BATCH=0
  if [ "$SIDE" = 1 ] && [ "$GBATCH" = 256 ]; then   # (its one-GPU steps take 115-118 GiB each)
    SIDE=0; echo "(--gpt-batch 256: one launch at a time)"
  fi
  if [ "$SIDE" = 1 ] && [ "${MEM:-0}" -lt 65536 ]; then   # (the GPT's one-GPU steps: 30 GiB each)
    SIDE=0; echo "(GPUs of $((${MEM:-0} / 1024)) GiB: one launch at a time; side by side needs 64 GiB a GPU)"
  fi
fi

COUNTING=0 TOTAL=0 DONE=0 T0=$(date +%s)
BATCH=0 DEPTH=0 TURNS="" TURN=0 GPU_AT=0
declare -A IN_BATCH=()                  # launches per batch (side by side), counted in the first walk
progress() {  # progress WHAT: count a launch (first walk), or say which one runs (second)
  if [ "$COUNTING" = 1 ]; then
    TOTAL=$((TOTAL + 1)); IN_BATCH[$BATCH]=$(( ${IN_BATCH[$BATCH]:-0} + 1 )); return 1
  fi
  DONE=$((DONE + 1)) LOG=$OUT/logs/$DONE   # this launch's output: LOG.out, msrun's in LOG/
  local t=$(( $(date +%s) - T0 ))
  printf '  [%d/%d, %d:%02d elapsed] %s\n' "$DONE" "$TOTAL" $((t / 60)) $((t % 60)) "$1"
}
finished() {  # finished WHAT CMD...: run CMD, then say its figure, or that it failed and why
  local what=$1; shift
  if "$@" > "$LOG.out" 2>&1; then
    local t=$(( $(date +%s) - T0 )) figure
    figure=$(cat "$LOG.out" "$LOG"/worker_0.log 2>/dev/null | grep "ms per step\|median step" | tail -n 1 || true)
    [ -z "$figure" ] || printf '  [%d:%02d elapsed] %s\n' $((t / 60)) $((t % 60)) "${figure#"${figure%%[! ]*}"}"
  else
    echo "  failed: $what"; tail -n 5 "$([ -f "$LOG/worker_0.log" ] && echo "$LOG/worker_0.log" || echo "$LOG.out")"
  fi
}
job() {  # job N WHAT CMD...: CMD on N devices; in a batch (side by side), in the background
  local n=$1 what=$2; shift 2     # on its own GPUs, timed in its turn (benchmarks/timing.py)
  if [ -z "$TURNS" ]; then finished "$what" "$@"; return 0; fi
  local gpus turn=$TURN
  gpus=$(for i in $(seq 0 $((n - 1))); do echo $(( (GPU_AT + i) % DEVICES )); done | paste -sd, -)
  GPU_AT=$(( (GPU_AT + n) % DEVICES )) TURN=$((TURN + 1))
  echo "$what" > "$TURNS/what-$turn"
  ( trap 'exit 130' INT TERM; export CUDA_VISIBLE_DEVICES=$gpus
    finished "$what" "$@" --turns "$TURNS" --turn "$turn" --of "${IN_BATCH[$BATCH]}"
    touch "$TURNS/ready-$turn" "$TURNS/$turn" "$TURNS/ended-$turn" ) &   # (one that never
}                                                                        # started: the next goes)
batch() {  # batch: the launches until end_batch start together (side by side); a batch
  DEPTH=$((DEPTH + 1))    # inside a batch is part of it
  [ "$DEPTH" = 1 ] || return 0
  BATCH=$((BATCH + 1))
  if [ "$SIDE" = 1 ] && [ "$COUNTING" = 0 ]; then
    TURNS=$OUT/turns-$BATCH TURN=0 GPU_AT=0; mkdir -p "$TURNS"
  fi
}
# stop_stragglers LAST: wait for the batch. A launch still running a minute after turn LAST
# is over hangs (a process that failed and did not exit): say so and stop it. Every 5 minutes
# with no launch ready or timed, say which launches the batch waits on.
stop_stragglers() {
  local waited=0 quiet=0 marks seen="" k ticks=0
  until [ -e "$TURNS/$1" ] && { [ -z "$(jobs -pr)" ] || [ $waited -ge 60 ]; }; do
    sleep 1; [ -e "$TURNS/$1" ] && waited=$((waited + 1))
    marks=$(ls "$TURNS" | wc -l)
    if [ "$marks" = "$seen" ]; then quiet=$((quiet + 1)); else quiet=0 seen=$marks; fi
    if [ $quiet -ge 300 ]; then quiet=0; waiting_on "$1"; fi
    ticks=$((ticks + 1)); [ $((ticks % 30)) != 0 ] || tick "$1"     # a line every 30 s
  done
  for k in $(seq 0 "$1"); do
    [ -e "$TURNS/ended-$k" ] || echo "  failed: $(cat "$TURNS/what-$k") did not end a minute after the last turn; stopped"
  done
  stop_launches
}
tick() {  # tick LAST: the time so far, and how many of the batch's launches compiled and were timed
  local t=$(( $(date +%s) - T0 )) ready timed
  ready=$(ls "$TURNS" | grep -c '^ready-' || true); timed=$(ls "$TURNS" | grep -c '^[0-9]*$' || true)
  printf '  [%d:%02d elapsed] %d of %d launches compiled, %d timed\n' $((t / 60)) $((t % 60)) \
    "$ready" $(( $1 + 1 )) "$timed"
}
waiting_on() {  # waiting_on LAST: say which launches the batch waits on (not ready, or timed now)
  local k late=""
  for k in $(seq 0 "$1"); do [ -e "$TURNS/ready-$k" ] || late="$late [$(cat "$TURNS/what-$k")]"; done
  [ -n "$late" ] || for k in $(seq 0 "$1"); do
    [ -e "$TURNS/$k" ] || { late=" [$(cat "$TURNS/what-$k")] in its turn"; break; }; done
  echo "  (5 minutes with no launch ready or timed; waiting on:$late)"
}
end_batch() {  # end_batch: every launch of the batch done
  DEPTH=$((DEPTH - 1))
  [ "$DEPTH" = 0 ] || return 0
  if [ -n "$TURNS" ]; then
    say "  (${IN_BATCH[$BATCH]:-0} launches compiling side by side, then timed one at a time)"
    stop_stragglers $(( ${IN_BATCH[$BATCH]:-0} - 1 ))
    wait; rm -rf "$TURNS"; TURNS=""
  fi
}
free_port() {  # a port no one listens on now, chosen by the OS (launchers side by side)
  python -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
}
msrun_on() {  # msrun_on N SCRIPT ARGS...: SCRIPT on N processes: one, mpiexec on CPU, msrun on GPUs
  local n=$1; shift
  if [ "$n" -eq 1 ]; then python "$@"
  elif [ "$DEVICE" = CPU ]; then mpiexec -n "$n" python "$@"
  else msrun --worker_num="$n" --local_worker_num="$n" --master_port="$(free_port)" \
      --log_dir="$LOG" --join=True "$@"; fi
}
torchrun_on() {  # torchrun_on N SCRIPT ARGS...: torch's launcher, N processes
  local n=$1; shift
  python -m torch.distributed.run --nproc-per-node "$n" --master-port "$(free_port)" "$@"
}
launch() {  # launch N WHAT ARGS...: benchmark.py on N processes (REPEATS windows in one launch)
  local n=$1 what=$2; shift 2
  progress "$what" || return 0
  job "$n" "$what" msrun_on "$n" benchmarks/benchmark.py --device "$DEVICE" --results "$RESULTS" \
    --steps "$STEPS" --repeats "$REPEATS" --precision "$PRECISION" $TF32 "$@"
}
launch_gpt() {  # launch_gpt N WHAT ARGS...: gpt_benchmark.py on N processes (pipe) or one
  local n=$1 what=$2; shift 2
  progress "$what" || return 0
  job "$n" "$what" msrun_on "$n" benchmarks/gpt_benchmark.py --device "$DEVICE" --results "$RESULTS" \
    --steps "$GSTEPS" --repeats "$REPEATS" --precision "$PRECISION" $TF32 --peak-tflops "$PEAK" \
    $([ "$n" -gt 1 ] && echo --stages "$n") "$@"
}
launch_torch_gpt() {  # launch_torch_gpt WHAT ARGS...: torch's step on the GPT, one device
  local what=$1; shift
  progress "$what" || return 0
  job 1 "$what" python benchmarks/torch_gpt.py --device "$([ "$DEVICE" = GPU ] && echo cuda || echo cpu)" \
    --results "$RESULTS" --steps "$GSTEPS" --repeats "$REPEATS" --precision "$PRECISION" $TF32 \
    --peak-tflops "$PEAK" "$@"
}
launch_torch() {  # launch_torch N WHAT ARGS...: torch.distributed.pipelining, same model and rows
  local n=$1 what=$2; shift 2
  progress "$what" || return 0
  job "$n" "$what" torchrun_on "$n" benchmarks/torch_pipeline.py --results "$RESULTS" \
    --steps "$STEPS" --repeats "$REPEATS" $TF32 "$@"
}
launch_torch_gpt_pipeline() {  # launch_torch_gpt_pipeline N WHAT ARGS...: torch's pipelining, the GPT
  local n=$1 what=$2; shift 2
  progress "$what" || return 0
  job "$n" "$what" torchrun_on "$n" benchmarks/torch_gpt_pipeline.py --results "$RESULTS" \
    --steps "$GSTEPS" --repeats "$REPEATS" --precision "$PRECISION" $TF32 --peak-tflops "$PEAK" "$@"
}
say() { [ "$COUNTING" = 1 ] || echo "$@"; }

wanted() { [ "$1" = all ] || [ "$1" = "$2" ]; }
size_of() {  # SIZE, M and pipe's fastest schedules (docs/performance.md) of a model on P stages
  if [ "$1" = small ]; then SIZE="--layers 8 --hidden 1024 --batch-size 64"; M=4; BEST="zb-h1 zb-v 1f1b"
  else SIZE="--layers 16 --hidden 8192 --inputs 8192 --batch-size 1024"; M=$((4 * $2))
    BEST="zb-v dualpipe-v 1f1b"; fi
}
HAS_TORCH=0   # torch is optional: its rows when it imports
python -c "import torch" 2>/dev/null && HAS_TORCH=1
TORCH=0 NO_TORCH="its script runs fp32 only"       # torch.distributed.pipelining's rows (MLPs)
if [ "$PRECISION" = fp32 ]; then
  if [ $HAS_TORCH = 1 ]; then TORCH=1; else NO_TORCH="torch is not importable"; fi
fi
TORCH_GPT=$HAS_TORCH NO_TORCH_GPT="torch is not importable"   # torch's step on the GPT
if [ $HAS_TORCH = 1 ] && [ "$DEVICE" = CPU ] && [ "$PRECISION" = fp16 ]; then
  TORCH_GPT=0 NO_TORCH_GPT="torch's GradScaler runs on CUDA only"
fi

gpt_size() {  # the GPT: GPT-2-small-sized on GPUs, scaled down on CPU cores; MFU's peak
  PEAK=0
  if [ "$DEVICE" = CPU ]; then GSIZE="--layers 2 --width 64 --heads 4 --context 64 --batch-size 16"
  else GSIZE="--layers 12 --width 768 --heads 12 --context 512 --batch-size $GBATCH"
    case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)" in   # dense peaks
      *H100*|*H200*) PEAK=989                                     # fp16
        if [ "$PRECISION" = fp32 ]; then PEAK=$([ -n "$TF32" ] && echo 495 || echo 67); fi ;; esac
  fi
}
headline_gpt() {  # one device: MindSpore's own step and torch's; pipe and torch's pipelining on
  gpt_size         # 2, 4, 8 devices up to P, M = 4 x stages (a pipeline-sized batch), 1F1B, one split
  say "== GPT (examples/gpt's layers, the token loss): $GSIZE"
  batch
  launch_gpt 1 "one device: MindSpore's own compiled step" $GSIZE --impl mindspore   # (whole)
  if [ $TORCH_GPT = 1 ]; then
    launch_torch_gpt "torch, one device: the same math (benchmarks/torch_gpt.py)" $GSIZE
  else
    say "  (no torch rows for the GPT: $NO_TORCH_GPT)"
  fi
  if [ $P = 1 ]; then
    launch_gpt 1 "pipe 1x1 M=1 (pipe chooses W and one graph)" $GSIZE --impl pipe $DEFER
  fi
  for p in 2 4 8; do
    [ $p -le $P ] || continue
    local m=$((GBATCH == 256 ? 16 : 4 * p))   # micro-batches of 64 / 4P sequences, or of 16
    launch_gpt $p "pipe ${p}x1 M=$m: 1f1b (pipe chooses W and one graph)" $GSIZE \
      --impl pipe --micro-batches $m --partition blocks $DEFER
    if [ $TORCH_GPT = 1 ] && [ "$DEVICE" = GPU ]; then
      launch_torch_gpt_pipeline $p "torch.distributed.pipelining ${p}x1 M=$m: 1f1b" $GSIZE \
        --micro-batches $m
    fi
  done
  if [ $TORCH_GPT = 1 ] && [ $P -gt 1 ] && [ "$DEVICE" != GPU ]; then
    say "  (no torch.distributed.pipelining row for the GPT: its script runs on CUDA GPUs)"
  fi
  end_batch
}
headline() {  # one device, pipe's best schedules, the built-in and torch, on all the devices:
  P=1; for p in 2 4 8; do [ $p -le "$DEVICES" ] && P=$p; done   # the large MLP on GPUs, the small
  if [ "$ONE_BATCH" = 1 ]; then batch; fi   # (side by side: all its launches start together)
  for model in small large; do                                    # one on CPU (or --model)
    wanted "$MODEL" "$model" || continue
    [ "$model" = large ] && [ "${SKIP_LARGE:-0}" = 1 ] && continue
    [ "$model" = small ] && [ "${SKIP_SMALL:-0}" = 1 ] && continue
    size_of $model $P
    say "== $model MLP: $SIZE"
    batch
    launch 1 "one device: MindSpore's own compiled step" $SIZE --impl builtin --micro-batches 1
    if [ $P = 1 ]; then   # one device: no pipeline, pipe's step beside MindSpore's
      launch 1 "pipe 1x1 M=1 (pipe chooses W and one graph)" $SIZE --micro-batches 1 $DEFER
    else
      launch $P "pipe ${P}x1 M=$M: ${BEST// /, } (pipe chooses W and one graph)" $SIZE --stages $P \
        --micro-batches $M --schedule "${BEST// /,}" $DEFER
      if [ "$DEVICE" != CPU ]; then
        launch $P "MindSpore built-in ${P}x1 M=$M" $SIZE --impl builtin --stages $P --micro-batches $M
      fi
      if [ $TORCH = 1 ]; then   # (torch has no ZB-H1 schedule)
        theirs=$(for s in $BEST; do [ $s = zb-h1 ] || echo $s; done | paste -sd,)
        launch_torch $P "torch.distributed.pipelining ${P}x1 M=$M: ${theirs//,/, }" $SIZE \
          --micro-batches $M --schedule "$theirs"
      else
        say "  (no torch.distributed.pipelining row: $NO_TORCH)"
      fi
    fi
    end_batch
  done
  if wanted "$MODEL" gpt; then headline_gpt; fi
  if [ "$ONE_BATCH" = 1 ]; then end_batch; fi
}

PIPES=""                  # pipe's runs: per action (pipe) and as one graph per step (pipe-graph)
wanted "$IMPL" pipe && PIPES="$PIPES pipe"
wanted "$IMPL" pipe-graph && PIPES="$PIPES pipe-graph"
flags_of() { echo $DEFER; if [ "$1" = pipe-graph ]; then echo --one-graph; else echo --no-one-graph; fi; }

sweep() {  # every wanted run (--all), in order
  for model in small large; do
    wanted "$MODEL" "$model" || continue
    size_of $model 1
    say "== $model MLP: $SIZE"
    if wanted "$LAYOUT" 1x1; then
      for impl in $PIPES; do
        launch 1 "$impl 1x1 M=1" $SIZE --micro-batches 1 $(flags_of $impl)
        done_m=" "
        for P in 2 4 8; do  # one device with each pipeline's M: the pipeline-efficiency reference
          [ $P -le "$DEVICES" ] || continue
          size_of $model $P
          case "$done_m" in *" $M "*) continue ;; esac
          done_m="$done_m$M "
          launch 1 "$impl 1x1 M=$M" $SIZE --micro-batches $M $(flags_of $impl)
        done
      done
      wanted "$IMPL" builtin && launch 1 "builtin 1x1" $SIZE --impl builtin --micro-batches 1
    fi
    for P in 1 2 4 8; do for D in 1 2 4 8; do
      n=$((P * D))
      [ $n -gt 1 ] && [ $n -le "$DEVICES" ] && wanted "$LAYOUT" "${P}x${D}" || continue
      size_of $model $P
      if [ $P -eq 1 ]; then
        for impl in $PIPES; do
          launch $n "$impl 1x$D" $SIZE --data-parallel $D --micro-batches 1 $(flags_of $impl)
        done
        continue
      fi
      schedules=""
      for schedule in $NAMES; do
        wanted "$SCHEDULE" $schedule || continue
        if [ $schedule = dualpipe-v ] && [ $M -lt $((2 * P)) ]; then
          say "  ${P}x${D} dualpipe-v skipped: it needs M >= 2P"; continue; fi
        schedules="$schedules,$schedule"
      done
      extra=""; [ $TRACE = 1 ] && extra="--trace $OUT/trace-$model-${P}x${D}"
      for impl in $PIPES; do   # (a trace records the loop's actions: one graph is one call)
        [ -n "$schedules" ] && launch $n "$impl ${P}x${D} M=$M: ${schedules#,}" $SIZE --stages $P \
          --data-parallel $D --schedule "${schedules#,}" --micro-batches $M \
          $([ $impl = pipe ] && echo $extra) $(flags_of $impl)
      done
      if [ "$DEVICE" != CPU ] && wanted "$IMPL" builtin; then
        launch $n "builtin ${P}x${D} M=$M" $SIZE --impl builtin --stages $P --data-parallel $D \
          --micro-batches $M
      fi
    done; done
  done
}
if [ "$HEADLINE" = 1 ] && [ "$MODEL" = all ]; then   # one MLP: the one a pipeline pays for here
  if [ "$DEVICE" = CPU ]; then
    echo "(CPU: the small MLP and the GPT scaled down; the large MLP's step takes minutes on CPU cores: --model large)"
    SKIP_LARGE=1
  else
    echo "(GPUs: the large MLP and the GPT; the small MLP, too small to pipeline: --model small)"
    SKIP_SMALL=1
  fi
fi
walk() {
  if [ "$HEADLINE" = 1 ]; then headline; return; fi
  sweep
  if [ "$MODEL" = gpt ]; then P=1; for p in 2 4 8; do [ $p -le "$DEVICES" ] && P=$p; done; headline_gpt; fi
}
COUNTING=1; walk; COUNTING=0; BATCH=0; walk
python benchmarks/report.py "$RESULTS"
