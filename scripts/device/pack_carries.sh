#!/usr/bin/env bash
# Cuts .wheels/ and the given folders (prepared features, a Boltz mols folder, ...) into one tar stream
# of 56 MiB parts, .carry-parts/part-NN (git-excluded): each part plus the working tree fits one
# device call (64 MiB). On the machine, each call copies its part to /tmp/parts; then
# scripts/device/unpack.sh joins and installs them.
#   scripts/device/pack_carries.sh .carry/feats .carry/mols
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .carry-parts
mkdir -p .carry-parts
tar cf - .wheels "$@" | split -b 56M -d - .carry-parts/part-
ls -l .carry-parts
