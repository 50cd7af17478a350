"""Featurize a Target into the tensors the Boltz-2 model consumes (OSS names, dtypes, shapes).

    featurized = featurize(target, StagedInputs.from_manifests(outdir, target), seed=0)
    model(featurized.features)  # every tensor has a leading batch dimension of 1

The atom axis is padded to a multiple of 32; `featurized.atoms` describes the real atoms in the
same order, so predicted `coords[:, :n_atoms]` map onto it. `stack_featurized` pads several
featurized targets into one batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from foldmill.errors import InputError
from foldmill.features.atoms import atom_features
from foldmill.features.ccd import ComponentLibrary
from foldmill.features.constraints import resolve_constraints
from foldmill.features.msa_features import chain_msa, msa_features
from foldmill.features.restraint_features import restraint_features
from foldmill.features.staged import StagedInputs
from foldmill.features.structure import build_structure
from foldmill.features.template_features import template_features
from foldmill.features.token_features import token_features
from foldmill.features.tokenize import Tokenized, tokenize
from foldmill.io.targets import Target
from foldmill.msa.parse import DEFAULT_MAX_DEPTH
from foldmill.msa.types import MSA
from foldmill.outputs.prediction import AtomSite
from foldmill.vocab import DEFAULT_METHOD, METHOD_TYPE_ID


@dataclass
class FeaturizedTarget:
    target_id: str
    features: dict[str, torch.Tensor]  # OSS Boltz-2 feature names, batch dimension 1
    atoms: AtomSite  # real atoms, in feature order
    token_chain_ids: np.ndarray  # (n_tokens,) chain id of each token
    sequences: dict[str, str]  # chain id -> one-letter sequence, CCD code or SMILES
    n_tokens: int
    n_atoms: int  # real atoms (the feature atom axis is padded to a multiple of 32)


_library_cache: dict[Path | None, ComponentLibrary] = {}


def featurize(
    target: Target,
    staged: StagedInputs | None = None,
    *,
    seed: int = 0,
    max_msa_seqs: int = DEFAULT_MAX_DEPTH,
    method: str | None = None,
    mols_dir: str | Path | None = None,
) -> FeaturizedTarget:
    """Features of one target; InputError naming file, record and problem for unusable input.

    seed: drives the random reference-conformer rotations (OSS-compatible stream).
    max_msa_seqs: rows kept per chain MSA (query included).
    method: experimental-method conditioning (default "x-ray diffraction", as OSS).
    mols_dir: a trusted Boltz `mols` directory to use instead of biotite's CCD (unpickled!).
    """
    staged = staged if staged is not None else StagedInputs.from_target(target)
    method = (method or DEFAULT_METHOD).lower()
    if method not in METHOD_TYPE_ID:
        known = ", ".join(METHOD_TYPE_ID)
        raise InputError(target.source, target.record, f"unknown method {method!r} (one of {known})")
    library = _library(mols_dir)
    tokenized = tokenize(build_structure(target, library))
    constraints = resolve_constraints(target, tokenized)
    # As in OSS, only protein chains use MSAs; copies of an entity share one.
    entity_msas: dict[int, MSA | None] = {}
    for chain in tokenized.structure.chains:
        if chain.entity_type == "protein" and chain.entity_id not in entity_msas:
            entity_msas[chain.entity_id] = staged.msa(target, chain.entity, max_msa_seqs)
    chain_msas = [
        chain_msa(np.array([residue.type_id for residue in chain.residues]), entity_msas.get(chain.entity_id))
        for chain in tokenized.structure.chains
    ]
    _check_templates(target, tokenized, staged)
    features = {
        **token_features(tokenized, constraints, method),
        **atom_features(tokenized, seed),
        **msa_features(tokenized, chain_msas),
        **template_features(tokenized, staged.templates),
        "ensemble_ref_idxs": torch.zeros(1, dtype=torch.long),
        **restraint_features(tokenized, constraints),
    }
    return FeaturizedTarget(
        target_id=target.target_id,
        features={name: value.unsqueeze(0).contiguous() for name, value in features.items()},
        atoms=_atom_site(tokenized),
        token_chain_ids=np.array([tokenized.structure.chains[a].name for a in tokenized.tokens.asym_id.tolist()]),
        sequences={chain.name: chain.label for chain in tokenized.structure.chains},
        n_tokens=len(tokenized.tokens),
        n_atoms=len(tokenized.atoms),
    )


def _library(mols_dir: str | Path | None) -> ComponentLibrary:
    key = Path(mols_dir).resolve() if mols_dir is not None else None
    if key not in _library_cache:
        _library_cache[key] = ComponentLibrary(key)
    return _library_cache[key]


def _check_templates(target: Target, tokenized: Tokenized, staged: StagedInputs) -> None:
    for template in staged.templates:
        chain = tokenized.structure.chain_by_name.get(template.chain_id)
        if chain is None or chain.entity_type != "protein":
            problem = f"template {template.alignment.template_id} is for {template.chain_id}, not a protein chain"
            raise InputError(target.source, target.record, problem)
        if len(template.alignment) and template.alignment.query_index.max() >= len(chain.residues):
            raise InputError(template.alignment.source, None, f"template alignment runs past chain {chain.name}")


def _atom_site(tokenized: Tokenized) -> AtomSite:
    atoms, tokens, chains = tokenized.atoms, tokenized.tokens, tokenized.structure.chains
    atom_chain = [chains[a] for a in tokens.asym_id[atoms.token].tolist()]
    residue_of = [tokenized.residues[uid].residue for uid in atoms.residue_uid.tolist()]
    return AtomSite(
        chain_ids=np.array([chain.name for chain in atom_chain]),
        entity_types=np.array([chain.entity_type for chain in atom_chain]),
        residue_numbers=np.array([residue.index + 1 for residue in residue_of], dtype=np.int64),
        residue_names=np.array([residue.name for residue in residue_of]),
        atom_names=atoms.names.astype(str),
        elements=atoms.symbols.astype(str),
        token_index=atoms.token.copy(),
    )


def stack_featurized(items: list[FeaturizedTarget]) -> dict[str, torch.Tensor]:
    """One padded batch from several featurized targets (zero padding, as OSS's collate)."""
    batch = {}
    for name in items[0].features:
        values = [item.features[name][0] for item in items]
        shape = [max(v.shape[d] for v in values) for d in range(values[0].dim())]
        padded = []
        for value in values:
            pads = []
            for size, target_size in zip(reversed(value.shape), reversed(shape)):
                pads += [0, target_size - size]
            padded.append(torch.nn.functional.pad(value, pads))
        batch[name] = torch.stack(padded)
    return batch
