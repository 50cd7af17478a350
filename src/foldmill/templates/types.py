"""A template aligned to one query chain: what the featurizer turns into template features.

Saved as `.npz` by `save` (no pickles: strings are stored as unicode arrays), read by `load`.
Only aligned residue pairs are stored, in query order:

  query_index             (n,) int64   0-based query residue
  template_index          (n,) int64   0-based position in the template chain's full sequence
                                       (entity sequence; unresolved residues included)
  template_residue_names  (n,) str     CCD names as in the template file (e.g. MSE stays MSE)
  coords                  (n, 4, 3) float32  N, CA, C, CB in the template file's frame (Angstrom)
  atom_mask               (n, 4) bool  which of N, CA, C, CB are resolved (Gly has no CB)
  template_id             e.g. "1aki_A" (structure id + template chain)
  source                  the template structure file
  template_chain_id       chain in that file (author chain id, as PDB and gemmi name chains)
  release_date            YYYY-MM-DD of the first release, "" if the file does not say
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from foldmill.errors import InputError
from foldmill.io.atomic import atomic_path

BACKBONE_ATOMS = ("N", "CA", "C", "CB")
_ARRAYS = ("query_index", "template_index", "template_residue_names", "coords", "atom_mask")
_TEXTS = ("template_id", "source", "template_chain_id", "release_date")


@dataclass
class TemplateAlignment:
    template_id: str
    source: str
    template_chain_id: str
    release_date: str
    query_index: np.ndarray  # (n,) int64
    template_index: np.ndarray  # (n,) int64
    template_residue_names: np.ndarray  # (n,) str
    coords: np.ndarray  # (n, 4, 3) float32
    atom_mask: np.ndarray  # (n, 4) bool

    def __len__(self) -> int:
        return int(self.query_index.shape[0])

    def save(self, path: str | Path) -> None:
        arrays = {name: getattr(self, name) for name in _ARRAYS}
        arrays["template_residue_names"] = np.asarray(self.template_residue_names, dtype=str)
        texts = {name: np.array(getattr(self, name), dtype=str) for name in _TEXTS}
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as handle:
                np.savez_compressed(handle, **arrays, **texts)

    @classmethod
    def load(cls, path: str | Path) -> TemplateAlignment:
        try:
            with np.load(path, allow_pickle=False) as data:
                values = {name: data[name] for name in _ARRAYS}
                texts = {name: str(data[name]) for name in _TEXTS}
        except (OSError, KeyError, ValueError) as error:
            raise InputError(str(path), None, f"not a template alignment: {error}") from None
        alignment = cls(**texts, **values)
        n = len(alignment)
        if alignment.coords.shape != (n, 4, 3) or alignment.atom_mask.shape != (n, 4):
            raise InputError(str(path), None, "template alignment arrays have inconsistent shapes")
        return alignment
