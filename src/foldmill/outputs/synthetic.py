"""Synthetic predictions of known values: exercise the writers, filters and report without a model.

Atoms are the heavy atoms of each residue's CCD component (biotite's CCD; polymers drop the leaving
atoms OXT/OP3, as in predicted structures), each residue centred on an ideal alpha-helix trace; chains
sit side by side 10 A apart. Tokens follow Boltz: one per standard polymer residue, one per
ligand atom. Confidences are drawn from a seeded generator in their valid ranges, so a test
knows every value that should come out of a file.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from foldmill.outputs.prediction import AtomSite, Prediction
from foldmill.vocab import residue_name

LEAVING_ATOMS = {"OXT", "OP3"}
HELIX_RADIUS, HELIX_RISE, HELIX_TURN = 2.3, 1.5, np.deg2rad(100.0)
CHAIN_SPACING = 10.0


def synthetic_prediction(
    target_id: str,
    chains: Sequence[tuple[str, str, str]],
    n_samples: int = 2,
    seed: int = 0,
    provenance: dict | None = None,
) -> Prediction:
    """A Prediction for `chains` = [(chain id, entity type, one-letter sequence or ligand CCD code)]."""
    rng = np.random.default_rng(seed)
    columns: dict[str, list] = {key: [] for key in ("chain", "type", "number", "residue", "atom", "element", "token")}
    positions: list[np.ndarray] = []
    token_chains: list[str] = []
    for chain_number, (chain_id, entity_type, sequence) in enumerate(chains):
        names = [sequence] if entity_type == "ligand" else [residue_name(entity_type, letter) for letter in sequence]
        for position, name in enumerate(names):
            atom_names, elements, ideal = _ccd_heavy_atoms(name, polymer=entity_type != "ligand")
            centre = np.array(
                [
                    CHAIN_SPACING * chain_number + HELIX_RADIUS * np.cos(HELIX_TURN * position),
                    HELIX_RADIUS * np.sin(HELIX_TURN * position),
                    HELIX_RISE * position,
                ]
            )
            positions.append(ideal - ideal.mean(axis=0) + centre)
            for index, (atom_name, element) in enumerate(zip(atom_names, elements)):
                if entity_type == "ligand" or index == 0:
                    token_chains.append(chain_id)  # a new token: every ligand atom, every residue
                columns["chain"].append(chain_id)
                columns["type"].append(entity_type)
                columns["number"].append(position + 1)
                columns["residue"].append(name)
                columns["atom"].append(atom_name)
                columns["element"].append(element)
                columns["token"].append(len(token_chains) - 1)
    atoms = AtomSite(
        chain_ids=np.array(columns["chain"]),
        entity_types=np.array(columns["type"]),
        residue_numbers=np.array(columns["number"]),
        residue_names=np.array(columns["residue"]),
        atom_names=np.array(columns["atom"]),
        elements=np.array(columns["element"]),
        token_index=np.array(columns["token"]),
    )
    base = np.concatenate(positions).astype(np.float32)
    n_tokens, n_chains = len(token_chains), len(chains)
    coords = np.stack([base + rng.normal(0, 0.5, base.shape).astype(np.float32) for _ in range(n_samples)])
    pair = rng.uniform(0.2, 0.95, (n_samples, n_chains, n_chains))
    pair = (pair + pair.transpose(0, 2, 1)) / 2
    multimer = n_chains > 1
    return Prediction(
        target_id=target_id,
        atoms=atoms,
        sequences={chain_id: sequence for chain_id, _, sequence in chains},
        token_chain_ids=np.array(token_chains),
        coords=coords,
        plddt=rng.uniform(0.3, 0.95, (n_samples, n_tokens)),
        pae=rng.uniform(0.5, 31.0, (n_samples, n_tokens, n_tokens)),
        pde=rng.uniform(0.5, 31.0, (n_samples, n_tokens, n_tokens)),
        ptm=rng.uniform(0.3, 0.95, n_samples),
        iptm=rng.uniform(0.2, 0.9, n_samples) if multimer else np.zeros(n_samples),
        ligand_iptm=rng.uniform(0.2, 0.9, n_samples) if multimer else np.zeros(n_samples),
        protein_iptm=rng.uniform(0.2, 0.9, n_samples) if multimer else np.zeros(n_samples),
        complex_plddt=rng.uniform(0.4, 0.95, n_samples),
        complex_iplddt=rng.uniform(0.4, 0.95, n_samples),
        complex_pde=rng.uniform(0.5, 10.0, n_samples),
        complex_ipde=rng.uniform(0.5, 10.0, n_samples) if multimer else np.zeros(n_samples),
        chains_ptm=np.stack([np.diagonal(sample) for sample in pair]),
        pair_chains_iptm=pair,
        provenance=provenance
        if provenance is not None
        else {"model": "demo", "seed": seed, "recipe": {"samples": n_samples}},
        runtime_seconds=float(rng.uniform(1, 60)),
    )


def _ccd_heavy_atoms(code: str, polymer: bool) -> tuple[list[str], list[str], np.ndarray]:
    from biotite.structure import info

    component = info.residue(code)
    keep = component.element != "H"
    if polymer:
        keep &= ~np.isin(component.atom_name, list(LEAVING_ATOMS))
    component = component[keep]
    return component.atom_name.tolist(), component.element.tolist(), component.coord.astype(np.float64)
