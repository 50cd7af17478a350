#!/usr/bin/env bash
# Wheels the H200 benchmark machine lacks (no network there), for Python 3.12, in four folders that each
# fit one 64 MiB device call: .whl1 + .whl2 cuEquivariance, .whl3 OSS Boltz-2's small dependencies,
# .whl3b RDKit. Add them to .git/info/exclude; copy them to /tmp/whl on the machine in three calls
# (docs/benchmarks/README.md), then `pip install --no-index --no-deps --target /tmp/site /tmp/whl/*.whl`.
set -euo pipefail
cd "$(dirname "$0")/../.."
platforms=()
for tag in manylinux_2_17 manylinux2014 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34; do
    platforms+=(--platform "${tag}_x86_64")
done
fetch() {
    local folder=$1
    shift
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d "$folder" "$@"
}
fetch .whl1 cuequivariance==0.13.0 cuequivariance-torch==0.13.0 cuequivariance-ops-cu13==0.13.0 platformdirs
fetch .whl2 cuequivariance-ops-torch-cu13==0.13.0
fetch .whl3 boltz-community==2.13.0 einx frozendict mashumaro chembl_structure_pipeline gemmi biopython dm-tree
fetch .whl3b rdkit
du -sh .whl1 .whl2 .whl3 .whl3b
