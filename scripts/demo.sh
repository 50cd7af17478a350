#!/usr/bin/env bash
# Set up foldmill and run the workflow on the embedded demo (config/demo/config.yaml) into results/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh demo
.venv/bin/snakemake --cores "$(nproc)" --configfile config/demo/config.yaml "$@"
