#!/bin/bash
# Session 7 device calls, one function per call: `bash calls.sh NAME` (from the repository root).
# Every call first copies the part of the carry stream it brought (scripts/device/pack_carries.sh).
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src
F=/tmp/stage/.carry/feats
S=docs/benchmarks/forward-h200/session7
mkdir -p /tmp/parts /tmp/stage && cp .carry-parts/part-* /tmp/parts/ 2>/dev/null

extract_prefix() {  # every whole file of the stream so far; then every whole wheel among them
  cat /tmp/parts/part-* | tar xf - -C /tmp/stage 2>/dev/null
  whole=$(python3 -c "import sys, zipfile; print(' '.join(w for w in sys.argv[1:] if zipfile.is_zipfile(w)))" /tmp/stage/.wheels/*.whl)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $whole > /tmp/pip.log 2>&1 || tail -3 /tmp/pip.log
  echo "installed: $(ls /tmp/site | grep -c dist-info) wheels"
}

# Lease 1, call 1: flash triangle-attention inner-loop variants (torch and triton only).
variants() {
  nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.max.sm --format=csv,noheader
  timeout ${VAR_TIMEOUT:-300} python3 $S/attention_variants.py $OUT/variants ${VAR_SIZES:-1024,1700,2560} > $OUT/variants.log 2>&1
  echo "variants rc=$?"; grep -v '"variant"' $OUT/variants.log | tail -5
  python3 - $OUT/variants.log <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{") and '"variant"' in l]
for n in sorted({r["tokens"] for r in rows}):
    best = sorted((r for r in rows if r["tokens"] == n and "ms" in r), key=lambda r: r["ms"])[:8]
    print(n, [(r["variant"], r["config"], r["ms"], r["error"], r["finite"]) for r in best])
    print("  failed:", [(r["variant"], r["config"]) for r in rows if r["tokens"] == n and "failed" in r][:6])
PY
}

# Lease 1, call 2: cuEquivariance; every GPU test.
gputests() {
  extract_prefix
  timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider -m gpu tests/ > $OUT/gpu_tests.log 2>&1
  echo "gpu tests rc=$?"; tail -6 $OUT/gpu_tests.log
}

stage() { ls -l /tmp/parts; nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader; }

# Lease 2, call 1: the shipped kernel after the change (broadcast key bias, both rows' products first).
kernel() {
  timeout 150 python3 $S/attention_variants.py $OUT/kernel 1024,1700,2560 shipped > $OUT/kernel.log 2>&1
  echo "kernel rc=$?"; tail -4 $OUT/kernel.log
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_triton_attention.py > $OUT/attention_tests.log 2>&1
  echo "attention tests rc=$?"; tail -2 $OUT/attention_tests.log
}

# Lease 2, call 2: cuEquivariance and the 1,000/1,700-token features (parts 0-1); foldmill's forward there.
forward() {
  extract_prefix
  timeout 300 python3 -m foldmill.bench.forward --features $F --inputs 1000,1700 --contenders foldmill --recycles 3 \
    --steps 200 --samples 5 --max-parallel 5 --warmup short --accuracy none --out $OUT/fw > $OUT/fw.log 2>&1
  echo "forward rc=$?"; tail -6 $OUT/fw.log
}

# Lease 2, calls 5-6: every part here; bench throughput on a 4-stratum sample of the full 200-2,800 range,
# foldmill's side in one call, OSS's in the next (one call is 10 minutes at most), same --out.
TP_ARGS="--work-dir /tmp/tp-work --device cuda --model demo-full --targets 1000 --seed 0 --min-length 200 --max-length 2800
  --msa-depth 2048 --sample ${TP_SAMPLE:-4} --stratified --recycling-steps 3 --sampling-steps 200 --diffusion-samples 5
  --max-parallel-samples 5 --cpu-workers 6 --queue-depth 4 --object-store-mb 8192 --oss --boltz-cache /tmp/boltz_cache"
tp_side() {  # SIDE TIMEOUT
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 1 > $OUT/gpu_util_$1.csv &
  timeout $2 python3 -m foldmill bench throughput -o /tmp/tp-out $TP_ARGS --side $1 --time-budget $(($2 - 30)) \
    > $OUT/bench_$1.log 2>&1
  echo "throughput $1 rc=$?"; tail -14 $OUT/bench_$1.log
  kill %1; cp -r /tmp/tp-out $OUT/tp
}
tp_foldmill() {
  rm -rf /tmp/site
  bash scripts/device/unpack.sh > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
  mkdir -p /tmp/boltz_cache && cp -r /tmp/stage/.carry/mols /tmp/boltz_cache/
  echo x > /tmp/boltz_cache/boltz2_conf.ckpt && echo x > /tmp/boltz_cache/boltz2_aff.ckpt  # never read: --checkpoint
  tp_side foldmill 540
}
tp_oss() { tp_side oss 580; }

"$@"
