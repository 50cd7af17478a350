#!/usr/bin/env bash
# Set up foldmill and run the test suite (GPU tests skip without CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
status=0
.venv/bin/python -m pytest "$@" || status=$?
# pytest exits 5 when it collected no test: that is a failure of the suite, not a pass.
exit "$status"
