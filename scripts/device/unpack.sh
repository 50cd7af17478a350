#!/usr/bin/env bash
# On the device machine, once every part is in /tmp/parts: unpack into /tmp/stage and install the
# wheels into /tmp/site (use PYTHONPATH=/tmp/site:$PWD/src).
set -euo pipefail
mkdir -p /tmp/stage
cat /tmp/parts/part-* | tar xf - -C /tmp/stage
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/stage/.wheels/*.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-build-isolation --target /tmp/site \
    /tmp/stage/.wheels/sdist/*.tar.gz
# Bytecode, as a normal install writes it (pip's --no-compile above only saves install time): without it,
# every process compiles each imported module again (~4 s of a replica's start-up on the H200).
python3 -m compileall -q -j 0 /tmp/site > /dev/null || true
echo "unpacked: $(ls /tmp/stage) ; site: $(ls /tmp/site | wc -l) entries"
