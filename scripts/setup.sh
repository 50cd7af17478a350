#!/usr/bin/env bash
# Set foldmill up on a fresh Debian machine: system packages, a virtualenv in .venv, the package.
# Usage: scripts/setup.sh demo|test
#   demo: what a workflow run needs (MMseqs2, foldmill and its dependencies)
#   test: also the test suite's needs (a local Slurm cluster, pytest, the Boltz-2 and ColabFold oracles)
# A rerun with nothing changed only checks: the Debian packages with dpkg, the Python install
# against a stamp in .venv holding a hash of pyproject.toml, this script, the Python version and this checkout's
# path (remove .venv/.foldmill-setup-* to force a reinstall).
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-test}"
case "$mode" in
    demo) extras="" ;;
    test) extras="[test]" ;;
    *) echo "setup: error: unknown mode '$mode' (use demo or test)" >&2; exit 2 ;;
esac

# Debian packages of this mode: the lines above [test], plus those below it in test mode.
wanted=()
section=all
while read -r line; do
    case "$line" in
        ''|'#'*) continue ;;
        '[test]') section=test; continue ;;
    esac
    if [ "$section" = all ] || [ "$mode" = test ]; then wanted+=("$line"); fi
done < scripts/apt-packages.txt
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
fingerprint="$( (cat pyproject.toml scripts/setup.sh; .venv/bin/python -V; pwd) | sha256sum | cut -d' ' -f1)"
# A test install holds everything a demo install does.
stamps=(".venv/.foldmill-setup-$mode")
[ "$mode" = demo ] && stamps+=(".venv/.foldmill-setup-test")
for stamp in "${stamps[@]}"; do
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$fingerprint" ]; then
        echo "setup: up to date ($mode; pyproject.toml unchanged)"
        exit 0
    fi
done

.venv/bin/python -m pip install -q --upgrade pip
# torch 2.13.0 is the CPU wheel (a bare 'torch' would pull a multi-GB CUDA build on CPU machines).
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -e ".${extras}"
if [ "$mode" = test ]; then
    # The CPU torch wheel brings no Triton, yet its interpreter runs the kernels' numerics and its
    # compiler builds them for sm_90 (register spills, shared memory) without a GPU. 3.6 is the
    # release they are measured with; where a CUDA torch brought its own Triton, that one stays.
    if ! .venv/bin/python -c 'import triton' 2>/dev/null; then
        .venv/bin/python -m pip install -q "triton==3.6.0"
    fi
    # ColabFold's own search, the oracle of the MSA tests. Its pins (pandas<3, biopython<1.86) clash
    # with foldmill's, so it lives in its own folder and the tests run it in a subprocess.
    .venv/bin/python -m pip install -q --no-deps --upgrade --target .venv/colabfold-oracle \
        "colabfold==1.6.3" "importlib-metadata>=8.6.1,<9" "zipp>=3.20"
fi
echo "$fingerprint" > ".venv/.foldmill-setup-$mode"
echo "setup: done ($mode; $(.venv/bin/python -c 'import foldmill; print("foldmill", foldmill.__version__)'))"
