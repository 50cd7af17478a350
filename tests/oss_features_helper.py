"""Run OSS Boltz-2's featurizer (via tests/oss_oracle.py) under conditions that make it comparable.

- `torch.manual_seed(seed)` right before featurizing: OSS draws its reference-conformer rotations
  from torch's global generator, foldmill from a generator seeded with the featurization seed.
- SMILES conformers: OSS embeds with ETKDGv3's default random seed (-1), i.e. differently on
  every run; here the embedding is seeded like foldmill's (`rdkit_chem.REFERENCE_SEED`).
- `corrected_deletions=True`: OSS's deletion table is wrapped so that its featurizer's
  re-slicing (featurizerv2.py: `chain_deletions = chain_deletions[del_start:del_end]` inside
  the loop over rows) reads each row's own deletions, i.e. OSS with that bug fixed.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from foldmill.features.rdkit_chem import REFERENCE_SEED
from oss_oracle import oss_features


class _SlicesOfFullTable(np.ndarray):
    """A table whose slices always index the full table, however often it was sliced before."""

    def __array_finalize__(self, obj) -> None:
        self._full = getattr(obj, "_full", obj)

    def __getitem__(self, key):
        if isinstance(key, slice):
            view = np.asarray(self._full)[key].view(_SlicesOfFullTable)
            view._full = self._full
            return view
        return np.asarray(self)[key]


def _with_full_table_slices(parse):
    def parse_and_wrap(*args, **kwargs):
        msa = parse(*args, **kwargs)
        deletions = msa.deletions.view(_SlicesOfFullTable)
        deletions._full = msa.deletions
        return dataclasses.replace(msa, deletions=deletions)

    return parse_and_wrap


class _SeededAllChem:
    """rdkit.Chem.AllChem with ETKDGv3 parameters seeded."""

    def __getattr__(self, name):
        from rdkit.Chem import AllChem

        return getattr(AllChem, name)

    def ETKDGv3(self):  # noqa: N802 - RDKit's name
        from rdkit.Chem import AllChem

        params = AllChem.ETKDGv3()
        params.randomSeed = REFERENCE_SEED
        return params


def oss_reference_features(
    yaml_path: str | Path, mols_dir: str | Path, seed: int = 0, corrected_deletions: bool = False
) -> dict[str, torch.Tensor]:
    import boltz.data.parse.a3m as a3m
    import boltz.data.parse.csv as csv
    import boltz.data.parse.schema as schema

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(schema, "AllChem", _SeededAllChem()))
        if corrected_deletions:
            stack.enter_context(mock.patch.object(a3m, "parse_a3m", _with_full_table_slices(a3m.parse_a3m)))
            stack.enter_context(mock.patch.object(csv, "parse_csv", _with_full_table_slices(csv.parse_csv)))
        torch.manual_seed(seed)
        return oss_features(yaml_path, mols_dir)
