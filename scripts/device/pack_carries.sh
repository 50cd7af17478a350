#!/usr/bin/env bash
# Cuts .wheels/ and the given folders (prepared features, a Boltz mols folder, ...) into one tar stream
# of 48 MiB parts, .carry-parts/part-NN (git-excluded): each part plus the working tree fits one
# device call (64 MiB). On the machine, each call copies its part to /tmp/parts; then
# scripts/device/unpack.sh joins and installs them.
#   scripts/device/pack_carries.sh .carry/feats .carry/mols
# PACK_FIRST (paths) go first in the stream, so the first parts already hold them: an early call can
# extract the stream so far (`tar xf` of a prefix yields every file it holds whole) and start working.
#   PACK_FIRST=".wheels/cuequivariance* .carry/feats/features_1000.npz" scripts/device/pack_carries.sh ...
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .carry-parts
mkdir -p .carry-parts
# shellcheck disable=SC2086  # PACK_FIRST is a list of globs
first=(${PACK_FIRST:-})
tar cf - "${first[@]}" $(for path in .wheels "$@"; do find "$path" -type f; done | grep -vxF -f <(printf '%s\n' "${first[@]}")) \
    | split -b 48M -d - .carry-parts/part-
ls -l .carry-parts
