"""Check a Prediction before anything is written: a bad one is rejected with a reason, never exported.

The executor records `InvalidPrediction` as a rejected target (status `rejected`, the reason in the
fold table) and goes on with the next one.
"""

from __future__ import annotations

import numpy as np

from foldmill.errors import FoldmillError, InputError
from foldmill.io.targets import ENTITY_TYPES, check_safe_id
from foldmill.outputs.prediction import CONFIDENCE_SCALARS
from foldmill.outputs.prediction import Prediction

# Boltz's per-sample scalars (confidence_score is derived): distance errors in Angstrom (>= 0),
# the other scores in [0, 1].
DISTANCE_FIELDS = ("complex_pde", "complex_ipde")
SCORE_FIELDS = tuple(key for key in CONFIDENCE_SCALARS if key not in (*DISTANCE_FIELDS, "confidence_score"))
ATOM_FIELDS = ("chain_ids", "entity_types", "residue_numbers", "residue_names", "atom_names", "elements", "token_index")


class InvalidPrediction(FoldmillError):
    """A prediction that must not be written; `reason` is what the fold table records."""

    def __init__(self, target_id: str, reason: str) -> None:
        self.target_id = target_id
        self.reason = reason
        super().__init__(f"{target_id}: prediction rejected: {reason}")


def validate_prediction(prediction: Prediction) -> None:
    """Raise InvalidPrediction naming every problem found; return quietly if the prediction is sound."""
    problems = prediction_problems(prediction)
    if problems:
        raise InvalidPrediction(str(prediction.target_id), "; ".join(problems))


def prediction_problems(prediction: Prediction) -> list[str]:
    """Every reason the prediction cannot be written (empty when it can)."""
    try:
        check_safe_id(str(prediction.target_id), "prediction", None)
    except InputError as error:
        return [error.problem]
    problems = _structure_problems(prediction)
    if problems:  # shapes below are defined by the structure, so stop here
        return problems
    return _confidence_problems(prediction)


def _structure_problems(prediction: Prediction) -> list[str]:
    coords = prediction.coords
    if not isinstance(coords, np.ndarray) or coords.ndim != 3 or coords.shape[2] != 3:
        return [f"coords must be an array (samples, atoms, 3), got {_shape(coords)}"]
    n_samples, n_atoms, _ = coords.shape
    if n_samples == 0 or n_atoms == 0:
        return [f"coords hold no samples or no atoms (shape {coords.shape})"]
    problems = []
    bad = ~np.isfinite(coords).all(axis=(1, 2))
    if bad.any():
        problems.append(f"non-finite coordinates (NaN/inf) in sample(s) {np.flatnonzero(bad).tolist()}")
    atoms = prediction.atoms
    for name in ATOM_FIELDS:
        values = getattr(atoms, name, None)
        if values is None or np.shape(values) != (n_atoms,):
            problems.append(f"atoms.{name} must have shape ({n_atoms},), got {_shape(values)}")
    token_chains = prediction.token_chain_ids
    if token_chains is None or np.ndim(token_chains) != 1 or len(token_chains) == 0:
        problems.append(f"token_chain_ids must be a non-empty 1-d array, got {_shape(token_chains)}")
    if problems:
        return problems
    n_tokens = len(token_chains)
    token_index = np.asarray(atoms.token_index)
    if token_index.min() < 0 or token_index.max() >= n_tokens:
        return [f"atoms.token_index outside [0, {n_tokens})"]
    if len(np.unique(token_index)) != n_tokens:
        problems.append("some tokens have no atoms")
    if not (np.asarray(token_chains)[token_index] == np.asarray(atoms.chain_ids)).all():
        problems.append("atoms.chain_ids disagree with token_chain_ids[atoms.token_index]")
    unknown = set(np.asarray(atoms.entity_types).tolist()) - set(ENTITY_TYPES)
    if unknown:
        problems.append(f"unknown entity types {sorted(unknown)} (expected one of {', '.join(ENTITY_TYPES)})")
    if (np.asarray(atoms.residue_numbers) < 1).any():
        problems.append("residue numbers must start at 1")
    if not _grouped_by_residue(atoms.chain_ids, atoms.residue_numbers):
        problems.append("atoms are not grouped by chain and residue")
    problems.extend(_chain_problems(prediction))
    return problems


def _chain_problems(prediction: Prediction) -> list[str]:
    atoms = prediction.atoms
    problems = []
    for chain in prediction.chain_order:
        in_chain = np.asarray(atoms.chain_ids) == chain
        types = set(np.asarray(atoms.entity_types)[in_chain].tolist())
        if len(types) != 1:
            problems.append(f"chain {chain} mixes entity types {sorted(types)}")
            continue
        sequence = prediction.sequences.get(chain)
        if not sequence:
            problems.append(f"no sequence for chain {chain}")
            continue
        residues = len(np.unique(np.asarray(atoms.residue_numbers)[in_chain]))
        if types != {"ligand"} and residues != len(sequence):
            problems.append(f"chain {chain}: {residues} residues in the structure but {len(sequence)} in its sequence")
    return problems


def _confidence_problems(prediction: Prediction) -> list[str]:
    n_samples = prediction.n_samples
    n_tokens = len(prediction.token_chain_ids)
    n_chains = len(prediction.chain_order)
    expected = {
        "plddt": (n_samples, n_tokens),
        "pae": (n_samples, n_tokens, n_tokens),
        "pde": (n_samples, n_tokens, n_tokens),
        **{name: (n_samples,) for name in SCORE_FIELDS + DISTANCE_FIELDS},
        "chains_ptm": (n_samples, n_chains),
        "pair_chains_iptm": (n_samples, n_chains, n_chains),
    }
    problems = []
    for name, shape in expected.items():
        values = getattr(prediction, name, None)
        if values is None:
            problems.append(f"missing confidence {name}")
        elif np.shape(values) != shape:
            problems.append(f"{name} has shape {_shape(values)}, expected {shape}")
        elif not np.isfinite(values).all():
            problems.append(f"{name} has non-finite values")
        elif name in ("plddt", "chains_ptm", "pair_chains_iptm", *SCORE_FIELDS) and not _in_unit_range(values):
            problems.append(f"{name} outside [0, 1]")
        elif name in ("pae", "pde", *DISTANCE_FIELDS) and (np.asarray(values) < 0).any():
            problems.append(f"{name} has negative values")
    return problems


def _grouped_by_residue(chain_ids: np.ndarray, residue_numbers: np.ndarray) -> bool:
    """True when each (chain, residue) occupies one contiguous run of atoms."""
    keys = list(zip(np.asarray(chain_ids).tolist(), np.asarray(residue_numbers).tolist()))
    runs = 1 + sum(a != b for a, b in zip(keys, keys[1:]))
    return runs == len(set(keys))


def _in_unit_range(values: np.ndarray) -> bool:
    values = np.asarray(values)
    return bool(((values >= 0) & (values <= 1)).all())


def _shape(values: object) -> str:
    return "None" if values is None else str(np.shape(values))
