"""What a folding engine hands to the writers: structures and confidences of one target.

Every array is unpadded (real atoms and tokens only), numpy, on the host. Samples are in the
order the sampler produced them; writers rank them by `confidence_score`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from foldmill.vocab import CONFIDENCE_SCALARS  # noqa: F401 - part of the writers' contract


@dataclass
class AtomSite:
    """Per-atom identity, aligned with the atom axis of `Prediction.coords`."""

    chain_ids: np.ndarray  # (n_atoms,) str, e.g. "A"
    entity_types: np.ndarray  # (n_atoms,) str: protein|dna|rna|ligand
    residue_numbers: np.ndarray  # (n_atoms,) int, 1-based within the chain
    residue_names: np.ndarray  # (n_atoms,) str, CCD code (e.g. "ALA", "DA", "SAH")
    atom_names: np.ndarray  # (n_atoms,) str, CCD atom name
    elements: np.ndarray  # (n_atoms,) str, element symbol
    token_index: np.ndarray  # (n_atoms,) int, the token each atom belongs to


@dataclass
class Prediction:
    target_id: str
    atoms: AtomSite
    sequences: dict[str, str]  # chain id -> one-letter sequence (polymers) or CCD/SMILES (ligands)
    token_chain_ids: np.ndarray  # (n_tokens,) str
    coords: np.ndarray  # (n_samples, n_atoms, 3) float32, Angstrom
    plddt: np.ndarray  # (n_samples, n_tokens) in [0, 1]
    pae: np.ndarray  # (n_samples, n_tokens, n_tokens) Angstrom
    pde: np.ndarray  # (n_samples, n_tokens, n_tokens) Angstrom
    ptm: np.ndarray  # (n_samples,)
    iptm: np.ndarray  # (n_samples,)
    ligand_iptm: np.ndarray  # (n_samples,)
    protein_iptm: np.ndarray  # (n_samples,)
    complex_plddt: np.ndarray  # (n_samples,)
    complex_iplddt: np.ndarray  # (n_samples,)
    complex_pde: np.ndarray  # (n_samples,)
    complex_ipde: np.ndarray  # (n_samples,)
    chains_ptm: np.ndarray  # (n_samples, n_chains), chain order = order of first appearance in token_chain_ids
    pair_chains_iptm: np.ndarray  # (n_samples, n_chains, n_chains)
    # Provenance written into every output: model ("demo" for random weights, else the
    # checkpoint's sha256), seed, recipe (recycles, steps, samples), foldmill version.
    provenance: dict[str, Any] = field(default_factory=dict)
    runtime_seconds: float = 0.0

    @property
    def n_samples(self) -> int:
        return int(self.coords.shape[0])

    @property
    def chain_order(self) -> list[str]:
        """Chain ids in order of first appearance in `token_chain_ids`: the axis order of chains_ptm."""
        return list(dict.fromkeys(str(c) for c in self.token_chain_ids))

    @property
    def confidence_score(self) -> np.ndarray:
        """Boltz's ranking score: (4 * complex_plddt + (iptm if nonzero else ptm)) / 5."""
        interface = np.where(self.iptm > 0, self.iptm, self.ptm)
        return (4 * self.complex_plddt + interface) / 5
