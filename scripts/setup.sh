#!/usr/bin/env bash
# Set foldmill up on a fresh Debian machine: system packages, a virtualenv in .venv, the package.
# Usage: scripts/setup.sh [EXTRAS]   (EXTRAS defaults to "test")
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test}"

mapfile -t wanted < <(grep -v -e '^#' -e '^$' scripts/apt-packages.txt)
missing=()
for package in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        echo "setup: installing Debian packages: ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "setup: warning: missing Debian packages (install them as root): ${missing[*]}" >&2
    fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch 2.13.0 is the CPU wheel (a bare 'torch' would pull a multi-GB CUDA build on CPU machines).
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -e ".[${extras}]"
echo "setup: done ($(.venv/bin/python -c 'import foldmill; print("foldmill", foldmill.__version__)'))"
