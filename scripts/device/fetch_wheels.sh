#!/usr/bin/env bash
# What the H200 benchmark machine lacks (no network there), for Python 3.12, into .wheels/ (git-excluded):
# cuEquivariance; OSS Boltz-2 with its dependencies (RDKit, and omegaconf/antlr4/ihm/modelcif for
# `boltz predict`; hydra is left out: its pytest plugin breaks pytest); Ray; biotite (the CCD the
# featurizer reads). antlr4 and ihm exist only as sources: .wheels/sdist/. pack_carries.sh then cuts
# them into parts that each fit one device call.
set -euo pipefail
cd "$(dirname "$0")/../.."
platforms=()
for tag in manylinux_2_17 manylinux2014 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34; do
    platforms+=(--platform "${tag}_x86_64")
done
mkdir -p .wheels/sdist
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .wheels \
    cuequivariance==0.13.0 cuequivariance-torch==0.13.0 cuequivariance-ops-cu13==0.13.0 \
    cuequivariance-ops-torch-cu13==0.13.0 platformdirs \
    boltz-community==2.13.0 einx frozendict mashumaro chembl_structure_pipeline gemmi biopython dm-tree rdkit \
    omegaconf==2.3.0 modelcif \
    ray==2.60.0 jsonschema jsonschema-specifications referencing rpds-py \
    biotite==1.6.0 biotraj==1.2.2
python3 -m pip download -q --no-deps --no-binary=:all: -d .wheels/sdist antlr4-python3-runtime==4.9.3 ihm==2.12
du -sh .wheels
