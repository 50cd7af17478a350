#!/bin/bash
# Profiling call: cuEquivariance only; GPU tests of the changed paths, trunk profile, memory per stage.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/parts /tmp/stage && cp .carry-mini/part-* /tmp/parts/
cat /tmp/parts/part-* | tar xf - -C /tmp/stage && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/stage/.wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
F=/tmp/stage/.carry/feats
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_fast_score.py tests/test_kernels_gpu.py tests/test_kernels_triton_layer_norm.py > $OUT/gpu_tests.log 2>&1; echo "gpu tests rc=$?"; tail -6 $OUT/gpu_tests.log
timeout 150 python3 .carry/s5/profile_trunk.py $OUT/prof 1000,2x600@2048,1700 $F > $OUT/prof.log 2>&1; echo "profile rc=$?"; tail -6 $OUT/prof.log
timeout 150 python3 -m foldmill.bench.forward --features $F --inputs 1000,1700 --contenders foldmill --recycles 3 --steps 200 \
  --samples 5 --max-parallel 5 --warmup short --accuracy none --out $OUT/mem > $OUT/mem.log 2>&1; echo "mem rc=$?"; tail -5 $OUT/mem.log
#!/bin/bash
# Device staging call: copy the carried part(s) to /tmp/parts.
mkdir -p /tmp/parts && cp .carry-parts/part-* /tmp/parts/ 2>/dev/null; ls /tmp/parts; df -h /tmp | tail -1
#!/bin/bash
# Last staging call: unpack and install everything.
export PYTHONUNBUFFERED=1
bash .carry/s5/stage.sh
bash scripts/device/unpack.sh > $OUT/install.log 2>&1 || { tail -20 $OUT/install.log; exit 1; }
tail -2 $OUT/install.log
export PYTHONPATH=/tmp/site:$PWD/src
python3 -c "import torch, triton, cuequivariance_torch, boltz, ray, biotite, gemmi, omegaconf, ihm, modelcif, rdkit; print(torch.__version__, triton.__version__, ray.__version__)" 2>&1 | tail -2
python3 -c "import boltz.main" 2>&1 | tail -2
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_triton_attention.py tests/test_kernels_gpu.py \
  -k "triangle_attention or flash or gated or fast_path or selection" > $OUT/gpu_tests.log 2>&1; echo "gpu tests rc=$?"; tail -6 $OUT/gpu_tests.log
#!/bin/bash
# Throughput: foldmill (Ray replica, fast path) and OSS `boltz predict` on the same sample.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src
mkdir -p /tmp/boltz_cache && cp -r /tmp/stage/.carry/mols /tmp/boltz_cache/ && echo x > /tmp/boltz_cache/boltz2_conf.ckpt && echo x > /tmp/boltz_cache/boltz2_aff.ckpt
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 1 > $OUT/gpu_util.csv &
SAMPLE=${TP_SAMPLE:-6}; CAP=${TP_CAP:-1200}; BUDGET=${TP_BUDGET:-480}
timeout $((BUDGET + 40)) python3 -m foldmill bench throughput -o $OUT/tp --work-dir /tmp/tp-work --device cuda --model demo-full \
  --targets 1000 --seed 0 --min-length 200 --max-length 2800 --msa-depth 2048 --sample $SAMPLE --sample-max-length $CAP \
  --recycling-steps 3 --sampling-steps 200 --diffusion-samples 5 --max-parallel-samples 5 --cpu-workers 6 --queue-depth 4 \
  --object-store-mb 8192 ${TP_OSS:---oss} --boltz-cache /tmp/boltz_cache --time-budget $BUDGET > $OUT/bench.log 2>&1
echo "throughput rc=$?"; tail -25 $OUT/bench.log
kill %1 2>/dev/null
cp /tmp/tp-work/runs/oss.log $OUT/tp/ 2>/dev/null; cp $OUT/tp/throughput.md $OUT/ 2>/dev/null; cd $OUT && tar czf tp_all.tgz tp gpu_util.csv bench.log && rm -rf tp gpu_util.csv; ls $OUT
#!/bin/bash
# One 6,000-token monomer: featurized here (biotite's CCD), folded once (no warm-up), default fast path.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src
timeout 560 python3 -m foldmill.bench.forward --inputs 6000 --contenders foldmill \
  --recycles ${BIG_RECYCLES:-0} --steps 200 --samples 1 --max-parallel 1 --warmup none --accuracy none --out $OUT/big6000 \
  > $OUT/big6000.log 2>&1; echo "big6000 rc=$?"; tail -12 $OUT/big6000.log; free -g | head -2
#!/bin/bash
# Forward: OSS eager and compiled vs foldmill on inputs not yet compared with OSS's compile path; then
# foldmill's 1,000-token memory row (per-stage peaks).
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src
F=/tmp/stage/.carry/feats
timeout 500 python3 -m foldmill.bench.forward --features $F --inputs ${FW_INPUTS:-32,2x48@256,300,2x150@256,2x300@256,700} \
  --contenders oss-eager,oss-compile,foldmill --recycles 3 --steps 200 --samples 5 --max-parallel 5 --warmup short \
  --accuracy none --time-budget ${FW_BUDGET:-470} --out $OUT/compile > $OUT/compile.log 2>&1; echo "compile rc=$?"; tail -12 $OUT/compile.log
timeout 80 python3 -m foldmill.bench.forward --features $F --inputs 1000 --contenders foldmill --recycles 3 \
  --steps 200 --samples 5 --max-parallel 5 --warmup short --accuracy none --out $OUT/mem1000 > $OUT/mem1000.log 2>&1
echo "mem1000 rc=$?"; tail -4 $OUT/mem1000.log
cd $OUT && tar czf fw_all.tgz compile mem1000 compile.log mem1000.log && cp compile/forward_bench.md compile.md; cp mem1000/forward_bench.md mem1000.md; rm -rf compile mem1000; ls
