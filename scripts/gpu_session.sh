#!/usr/bin/env bash
# One batched GPU session: the GPU test suite, then the benchmarks named on the command line,
# each under its own time limit, logs and bench records under $OUT (the lent machine copies it back).
#   OUT=/tmp/out bash scripts/gpu_session.sh tests:300 "zero:120:gobrrr bench zero" ...
# Each argument is NAME:SECONDS[:COMMAND]; NAME "tests" runs `pytest -m gpu tests`.
set -u
OUT=${OUT:-/tmp/gobrrr-gpu-out}
mkdir -p "$OUT/results"
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1 GOBRRR_GIT_SHA=${GOBRRR_GIT_SHA:-} GOBRRR_BENCH_RESULTS="$OUT/results"
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor-cache}
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")'
git rev-parse --short HEAD 2>/dev/null || true
for spec in "$@"; do
  name=${spec%%:*}; rest=${spec#*:}; secs=${rest%%:*}; cmd=${rest#*:}
  [ "$cmd" = "$rest" ] && cmd=""
  [ "$name" = tests ] && cmd="python3 -m pytest -q -p no:cacheprovider -m gpu tests"
  echo "=== $name (limit ${secs}s): $cmd"
  start=$(date +%s)
  timeout --kill-after=10 "$secs" bash -c "$cmd" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "=== $name rc=$rc in $(( $(date +%s) - start ))s"
  tail -n 25 "$OUT/$name.log"
done
