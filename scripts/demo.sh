#!/usr/bin/env bash
# Set up foldmill and run the workflow on the embedded demo (config/config.yaml) into results/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
.venv/bin/snakemake --cores "$(nproc)" --configfile config/config.yaml "$@"
