#!/bin/bash
# Session 6 device calls, one function per call: `bash calls.sh NAME` (from the repository root).
# Every call first copies the part of the carry stream it brought (scripts/device/pack_carries.sh).
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src
F=/tmp/stage/.carry/feats
S=docs/benchmarks/forward-h200/session6
mkdir -p /tmp/parts /tmp/stage && cp .carry-parts/part-* /tmp/parts/ 2>/dev/null

extract_prefix() {  # every whole file of the stream so far; then every whole wheel among them
  cat /tmp/parts/part-* | tar xf - -C /tmp/stage 2>/dev/null
  whole=$(python3 -c "import sys, zipfile; print(' '.join(w for w in sys.argv[1:] if zipfile.is_zipfile(w)))" /tmp/stage/.wheels/*.whl)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $whole > /tmp/pip.log 2>&1 || tail -3 /tmp/pip.log
  echo "installed: $(ls /tmp/site | grep -c dist-info) wheels"
}

stage() { ls -l /tmp/parts; nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader; }

# Call 2: cuEquivariance; GPU tests; micro-benchmarks; foldmill at 1,000 and 1,700 tokens (memory per stage).
kernels() {
  extract_prefix
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py tests/test_kernels_triton_attention.py \
    tests/test_kernels_triton_layer_norm.py tests/test_fast_score.py > $OUT/gpu_tests.log 2>&1
  echo "gpu tests rc=$?"; tail -4 $OUT/gpu_tests.log
  timeout 150 python3 $S/micro.py $OUT/micro 1024,2048,3072 1024,1700 > $OUT/micro.log 2>&1; echo "micro rc=$?"; cat $OUT/micro.log | tail -8
  timeout 150 python3 -m foldmill.bench.forward --features $F --inputs 1000,1700 --contenders foldmill --recycles 3 --steps 200 \
    --samples 5 --max-parallel 5 --warmup short --accuracy none --out $OUT/mem > $OUT/mem.log 2>&1; echo "mem rc=$?"; tail -6 $OUT/mem.log
}

# Call 3: one 6,000-token monomer, folded once (no warm-up), the default fast path.
big() {
  extract_prefix
  timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py -k graphs_equal_eager 2>&1 | tail -2
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -l 5 > $OUT/big_mem.csv &
  timeout ${BIG_TIMEOUT:-560} python3 -m foldmill.bench.forward --features $F --inputs ${BIG_INPUT:-6000} --contenders foldmill \
    --recycles ${BIG_RECYCLES:-0} --steps ${BIG_STEPS:-10} --samples 1 --max-parallel 1 --warmup none --accuracy none --out $OUT/big \
    > $OUT/big.log 2>&1; echo "big rc=$?"; tail -12 $OUT/big.log
  kill %1
}

# Call 4: OSS eager and torch.compile vs foldmill (the whole carry: OSS Boltz-2 and its mols).
oss() {
  extract_prefix
  python3 -m pip install -q --no-index --no-deps --no-compile --no-build-isolation --target /tmp/site \
    /tmp/stage/.wheels/sdist/*.tar.gz > $OUT/install.log 2>&1 || tail -3 $OUT/install.log
  python3 -c "import boltz.main, cuequivariance_torch; print('boltz ok')" 2>&1 | tail -1
  timeout ${FW_TIMEOUT:-560} python3 -m foldmill.bench.forward --features $F --inputs ${FW_INPUTS:-1000,1700} \
    --contenders ${FW_CONTENDERS:-oss-eager,oss-compile,foldmill} --recycles 3 --steps 200 --samples 5 --max-parallel 5 --warmup short \
    --accuracy ${FW_ACCURACY:-none} --time-budget ${FW_BUDGET:-520} --out $OUT/oss > $OUT/oss.log 2>&1
  echo "oss rc=$?"; tail -8 $OUT/oss.log
}

# Not run this session (no device time left): foldmill bench throughput with OSS, as session 5's r2.
# Needs the whole stream, Ray and biotite included (foldmill's featurizer reads biotite's CCD; this
# session's stream left biotite out), so `scripts/device/unpack.sh` installs everything.
throughput() {
  bash scripts/device/unpack.sh > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
  mkdir -p /tmp/boltz_cache && cp -r /tmp/stage/.carry/mols /tmp/boltz_cache/
  echo x > /tmp/boltz_cache/boltz2_conf.ckpt && echo x > /tmp/boltz_cache/boltz2_aff.ckpt  # never read: --checkpoint
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 1 > $OUT/gpu_util.csv &
  timeout $((${TP_BUDGET:-480} + 40)) python3 -m foldmill bench throughput -o $OUT/tp --work-dir /tmp/tp-work --device cuda \
    --model demo-full --targets 1000 --seed 0 --min-length 200 --max-length 2800 --msa-depth 2048 --sample ${TP_SAMPLE:-6} \
    --sample-max-length ${TP_CAP:-1200} --recycling-steps 3 --sampling-steps 200 --diffusion-samples 5 \
    --max-parallel-samples 5 --cpu-workers 6 --queue-depth 4 --object-store-mb 8192 --oss --boltz-cache /tmp/boltz_cache \
    --time-budget ${TP_BUDGET:-480} > $OUT/bench.log 2>&1
  echo "throughput rc=$?"; tail -25 $OUT/bench.log
  kill %1
}

"$@"
