"""Per-token and token-pair features: identity, bonds, contact conditioning, cyclic periods."""

from __future__ import annotations

import numpy as np
import torch
from torch.nn.functional import one_hot

from foldmill.features.constraints import Constraints
from foldmill.features.tokenize import Tokenized
from foldmill.vocab import BOND_TYPE_ID, CONTACT_CONDITIONING, METHOD_TYPE_ID, MOL_TYPE_ID, NUM_TOKENS


def token_features(tokenized: Tokenized, constraints: Constraints, method: str) -> dict[str, torch.Tensor]:
    tokens = tokenized.tokens
    n = len(tokens)
    bonds, bond_types = _token_bonds(tokenized, constraints)
    conditioning, thresholds = _contact_conditioning(tokenized, constraints)
    # At inference nothing is resolved experimentally: every token counts as present, and the
    # coordinates behind the distogram/center features are all zero.
    return {
        "token_index": torch.arange(n, dtype=torch.long),
        "residue_index": torch.from_numpy(tokens.residue_index),
        "asym_id": torch.from_numpy(tokens.asym_id),
        "entity_id": torch.from_numpy(tokens.entity_id),
        "sym_id": torch.from_numpy(tokens.sym_id),
        "mol_type": torch.from_numpy(tokens.mol_type),
        "res_type": one_hot(torch.from_numpy(tokens.res_type), num_classes=NUM_TOKENS),
        "disto_center": torch.zeros(n, 3, dtype=torch.float32),
        "token_bonds": bonds.unsqueeze(-1),
        "type_bonds": bond_types,
        "token_pad_mask": torch.ones(n, dtype=torch.float32),
        "token_resolved_mask": torch.ones(n, dtype=torch.float32),
        "token_disto_mask": torch.ones(n, dtype=torch.float32),
        "contact_conditioning": one_hot(conditioning, num_classes=len(CONTACT_CONDITIONING)),
        "contact_threshold": thresholds,
        "method_feature": torch.full((n,), METHOD_TYPE_ID[method], dtype=torch.long),
        "modified": torch.from_numpy(tokens.modified),
        "cyclic_period": torch.from_numpy(_cyclic_period(tokenized, constraints)),
        "affinity_token_mask": torch.from_numpy(tokens.affinity_mask).float(),
    }


def _token_bonds(tokenized: Tokenized, constraints: Constraints) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric token adjacency and bond class + 1 (0 = none) from residue-internal and user bonds.

    Bonds inside one modified-residue token land on the diagonal, as in OSS.
    """
    n = len(tokenized.tokens)
    atom_token = tokenized.atoms.token
    pairs = [tokenized.bonds]
    if constraints.connections:
        pairs.append(
            np.array([(c.atom_1, c.atom_2, BOND_TYPE_ID["COVALENT"]) for c in constraints.connections], dtype=np.int64)
        )
    all_bonds = np.concatenate(pairs)
    first, second = atom_token[all_bonds[:, 0]], atom_token[all_bonds[:, 1]]
    kinds = torch.from_numpy(all_bonds[:, 2] + 1)
    first, second = torch.from_numpy(first), torch.from_numpy(second)
    bonds = torch.zeros(n, n, dtype=torch.float32)
    bonds[first, second] = 1.0
    bonds[second, first] = 1.0
    bond_types = torch.zeros(n, n, dtype=torch.long)
    # Later bonds overwrite earlier ones on the same token pair; assign in order to keep that.
    for a, b, kind in zip(first.tolist(), second.tolist(), kinds.tolist()):
        bond_types[a, b] = kind
        bond_types[b, a] = kind
    return bonds, bond_types


def _token_keys(tokenized: Tokenized) -> list[tuple[int, int]]:
    """How constraints name each token: (asym, residue index) or, for ligand atoms, (asym, atom index)."""
    tokens = tokenized.tokens
    is_ligand = tokens.mol_type == MOL_TYPE_ID["ligand"]
    second = np.where(is_ligand, tokens.atom_start, tokens.residue_index)
    return list(zip(tokens.asym_id.tolist(), second.tolist()))


def _contact_conditioning(tokenized: Tokenized, constraints: Constraints) -> tuple[torch.Tensor, torch.Tensor]:
    n = len(tokenized.tokens)
    conditioning = np.full((n, n), CONTACT_CONDITIONING["UNSELECTED"], dtype=np.int64)
    thresholds = np.zeros((n, n), dtype=np.float64)
    if constraints.pockets or constraints.contacts:
        keys = _token_keys(tokenized)
        first_token = {}
        for index, key in enumerate(keys):
            first_token.setdefault(key, index)
        for pocket in constraints.pockets:
            binder = tokenized.tokens.asym_id == pocket.binder
            contacts = set(pocket.contacts)
            for index, key in enumerate(keys):
                if key in contacts:
                    conditioning[binder, index] = CONTACT_CONDITIONING["BINDER>POCKET"]
                    conditioning[index, binder] = CONTACT_CONDITIONING["POCKET>BINDER"]
                    thresholds[binder, index] = pocket.max_distance
                    thresholds[index, binder] = pocket.max_distance
        for contact in constraints.contacts:
            if contact.token_1 in first_token and contact.token_2 in first_token:
                a, b = first_token[contact.token_1], first_token[contact.token_2]
                conditioning[a, b] = conditioning[b, a] = CONTACT_CONDITIONING["CONTACT"]
                thresholds[a, b] = thresholds[b, a] = contact.max_distance
    if (conditioning == CONTACT_CONDITIONING["UNSELECTED"]).all():
        conditioning[:] = CONTACT_CONDITIONING["UNSPECIFIED"]
    return torch.from_numpy(conditioning), torch.from_numpy(thresholds).float()


def _cyclic_period(tokenized: Tokenized, constraints: Constraints) -> np.ndarray:
    """Chain length for cyclic chains (flag, or a user bond joining the first and last residue), else 0.

    OSS compares the bond's residues with the chain length using target-wide residue numbers,
    so it only recognizes such a ring on the first chain; we check chain-local numbers.
    """
    periods = tokenized.tokens.cyclic_period.astype(np.float32)
    for connection in constraints.connections:
        if connection.chain_1 != connection.chain_2 or connection.residue_1 == connection.residue_2:
            continue
        chain = tokenized.structure.chains[connection.chain_1]
        length = len(chain.residues)
        ends = {connection.residue_1, connection.residue_2}
        if length > 2 and ends == {0, length - 1}:
            on_chain = tokenized.tokens.asym_id == connection.chain_1
            periods[on_chain] = np.maximum(periods[on_chain], length)
    return periods
