#!/usr/bin/env bash
# On the H200 machine, from the repository root, after the wheels are in /tmp/whl (fetch_wheels.sh):
# install them, then `foldmill bench forward` on FEATURES (made here by `foldmill bench forward
# --prepare --features DIR --inputs ...`) with the arguments given, results under $OUT/forward.
#   scripts/device/forward_bench.sh FEATURES --inputs 150,700 --contenders oss-eager,foldmill
set -uo pipefail
features=$1
shift
export PYTHONUNBUFFERED=1
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src
python3 -m foldmill.bench.forward --features "$features" --recycles 3 --steps 200 --samples 5 --max-parallel 5 \
    --warmup short --out "$OUT/forward" "$@" 2>&1 | tee "$OUT/forward.log"
