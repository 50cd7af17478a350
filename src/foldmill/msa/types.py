"""The staged MSA of one chain: what the featurizer consumes.

Saved as `.npz` (keys `residues`, `deletions`, `keys`) by `save`, read back by `load`.
Row 0 is always the query. `residues` holds aligned upper-case one-letter codes as ASCII bytes
(gap = '-'), one column per query residue; `deletions[i, j]` counts the insertions (lower-case
letters in A3M) in row i just before column j; `keys[i]` is the pairing key of row i (e.g. a
UniProt taxonomy/accession key; "" = unpaired). Searched MSAs also keep `fingerprints`: a 64-bit
digest per row of the text Boltz compares to drop repeated rows (the row without gaps, upper-cased,
insertions included), which the arrays alone cannot tell apart; combining a chain's paired and
unpaired rows later needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from foldmill.io.atomic import atomic_path


@dataclass
class MSA:
    residues: np.ndarray  # (depth, length) uint8 ASCII
    deletions: np.ndarray  # (depth, length) int32
    keys: np.ndarray  # (depth,) str
    fingerprints: np.ndarray | None = None  # (depth,) uint64, see above; None = not recorded

    @property
    def depth(self) -> int:
        return int(self.residues.shape[0])

    @property
    def length(self) -> int:
        return int(self.residues.shape[1])

    @property
    def query(self) -> str:
        return self.residues[0].tobytes().decode()

    def save(self, path: str | Path) -> None:
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as handle:
                arrays = {"residues": self.residues, "deletions": self.deletions, "keys": self.keys.astype(str)}
                if self.fingerprints is not None:
                    arrays["fingerprints"] = self.fingerprints
                np.savez_compressed(handle, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> MSA:
        with np.load(path, allow_pickle=False) as data:
            fingerprints = data["fingerprints"] if "fingerprints" in data.files else None
            return cls(data["residues"], data["deletions"], data["keys"], fingerprints)

    def select_rows(self, rows: np.ndarray) -> MSA:
        """The MSA restricted to `rows` (indices, in the given order)."""
        fingerprints = None if self.fingerprints is None else self.fingerprints[rows]
        return MSA(self.residues[rows], self.deletions[rows], self.keys[rows], fingerprints)

    def crop_columns(self, start: int, stop: int) -> MSA:
        """The MSA over query columns [start, stop); insertions before `start` stay on column 0.
        Fingerprints describe whole rows, so the crop drops them."""
        return MSA(self.residues[:, start:stop], self.deletions[:, start:stop], self.keys)

    @staticmethod
    def read_depth(path: str | Path) -> int:
        """The depth of a saved MSA, reading only its keys."""
        with np.load(path, allow_pickle=False) as data:
            return int(data["keys"].shape[0])

    @classmethod
    def single_sequence(cls, sequence: str) -> MSA:
        residues = np.frombuffer(sequence.encode(), dtype=np.uint8)[None, :].copy()
        return cls(residues, np.zeros(residues.shape, dtype=np.int32), np.array([""]))
