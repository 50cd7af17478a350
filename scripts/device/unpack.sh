#!/usr/bin/env bash
# On the device machine, once every part is in /tmp/parts: unpack into /tmp/stage and install the
# wheels into /tmp/site (use PYTHONPATH=/tmp/site:$PWD/src).
set -euo pipefail
mkdir -p /tmp/stage
cat /tmp/parts/part-* | tar xf - -C /tmp/stage
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/stage/.wheels/*.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-build-isolation --target /tmp/site \
    /tmp/stage/.wheels/sdist/*.tar.gz
echo "unpacked: $(ls /tmp/stage) ; site: $(ls /tmp/site | wc -l) entries"
