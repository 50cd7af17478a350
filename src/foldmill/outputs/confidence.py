"""Per-model confidence outputs: Boltz's confidence JSON and the interface PAE foldmill adds.

The JSON has exactly Boltz's keys and layout: scalars as floats, `chains_ptm` and
`pair_chains_iptm` as dicts keyed by chain index strings ("0", "1", ... in the order of
first appearance of the chain), as `json.dump` writes Boltz's integer-keyed dicts.
"""

from __future__ import annotations

import numpy as np

from foldmill.outputs.layout import Chain
from foldmill.outputs.prediction import CONFIDENCE_SCALARS, Prediction

# Token pairs from different chains closer than this (representative atoms) form the interface.
INTERFACE_CUTOFF = 8.0
# Representative atom of a polymer token: CB (CA for glycine) for amino acids, C1' for nucleotides.
REPRESENTATIVE_ATOMS = ("CB", "CA", "C1'")


def confidence_summary(prediction: Prediction, sample: int) -> dict[str, object]:
    """Boltz's confidence_<id>_model_<rank>.json content for one sample."""
    summary: dict[str, object] = {"confidence_score": float(prediction.confidence_score[sample])}
    for key in CONFIDENCE_SCALARS[1:]:
        summary[key] = float(getattr(prediction, key)[sample])
    chains_ptm = np.asarray(prediction.chains_ptm[sample], dtype=np.float64)
    pair = np.asarray(prediction.pair_chains_iptm[sample], dtype=np.float64)
    summary["chains_ptm"] = {str(i): float(value) for i, value in enumerate(chains_ptm)}
    summary["pair_chains_iptm"] = {
        str(i): {str(j): float(pair[i, j]) for j in range(pair.shape[1])} for i in range(pair.shape[0])
    }
    return summary


def representative_atoms(prediction: Prediction, chains: list[Chain]) -> np.ndarray:
    """One atom index per token: CB/CA/C1' for polymer residues, else the token's first atom."""
    names = np.asarray(prediction.atoms.atom_names).astype(str)
    token_index = np.asarray(prediction.atoms.token_index)
    chosen = np.full(len(prediction.token_chain_ids), -1)
    for chain in chains:
        for residue in chain.residues:
            preferred = None
            if chain.is_polymer and len(residue.tokens) == 1:
                for name in REPRESENTATIVE_ATOMS:
                    hits = residue.atoms[names[residue.atoms] == name]
                    if len(hits):
                        preferred = hits[0]
                        break
            for atom in residue.atoms[::-1]:  # first atom of each token wins
                chosen[token_index[atom]] = atom
            if preferred is not None:
                chosen[residue.tokens[0]] = preferred
    return chosen


def interface_pae(prediction: Prediction, chains: list[Chain], sample: int) -> tuple[float | None, int]:
    """Mean PAE over inter-chain token pairs in contact (< 8 A between representative atoms), both
    directions, and the number of such pairs; (None, 0) when no chains touch (or a single chain)."""
    token_chain = np.asarray(prediction.token_chain_ids).astype(str)
    names = list(dict.fromkeys(token_chain.tolist()))
    if len(names) < 2:
        return None, 0
    points = np.asarray(prediction.coords[sample], dtype=np.float64)[representative_atoms(prediction, chains)]
    pae = np.asarray(prediction.pae[sample])
    tokens = [np.flatnonzero(token_chain == name) for name in names]
    total, count = 0.0, 0
    block = 512  # rows per step keeps memory at block x tokens for large complexes
    # Each pair of chains once: a contact of (a, b) is one of (b, a) too, with its own PAE.
    for first, rows_of in enumerate(tokens):
        for cols in tokens[first + 1 :]:
            for start in range(0, len(rows_of), block):
                rows = rows_of[start : start + block]
                squared = ((points[rows, None, :] - points[None, cols, :]) ** 2).sum(-1)
                row_index, col_index = np.nonzero(squared < INTERFACE_CUTOFF**2)
                total += float(pae[rows[row_index], cols[col_index]].sum(dtype=np.float64))
                total += float(pae[cols[col_index], rows[row_index]].sum(dtype=np.float64))
                count += 2 * len(row_index)
    return (total / count if count else None), count
