"""A Target as chains of residues with reference chemistry: the input to tokenization.

Follows OSS Boltz-2's input parsing so that every index matches:
- entities with the same type and sequence (or CCD code, or SMILES) are one entity; chains are
  ordered entity by entity in order of first appearance (asym_id), copies numbered by sym_id;
- a standard residue keeps the heavy atoms of the fixed standard layout (`residues.py`);
- a modified residue (CCD code in a polymer) keeps its heavy atoms minus leaving atoms, MSE is
  read as MET; a CCD or SMILES ligand keeps all heavy atoms; SMILES ligands are named LIG1, LIG2...
Unlike OSS, entities that differ only in modifications or cyclic flag stay separate entities
(OSS would silently apply the first one's modifications to all).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from foldmill.errors import InputError
from foldmill.features.ccd import Component, ComponentLibrary, component_type
from foldmill.features.residues import STANDARD_ATOMS, center_atom, disto_atom
from foldmill.io.targets import Entity, Target
from foldmill.vocab import MOL_TYPE_ID, TOKEN_ID, UNKNOWN_TOKEN_ID, residue_name


@dataclass
class Residue:
    name: str  # CCD code, or LIGn for a SMILES ligand
    index: int  # 0-based position in the chain
    type_id: int  # vocabulary class in the residue table (what the MSA of the chain holds)
    component: Component
    atoms: np.ndarray  # kept heavy atoms (indices into component), in feature order
    is_standard: bool
    center: int  # position of the center atom within `atoms`
    disto: int  # position of the distogram atom within `atoms`


@dataclass
class Chain:
    name: str  # chain id
    entity: Entity
    entity_id: int
    sym_id: int
    asym_id: int
    residues: list[Residue]

    @property
    def entity_type(self) -> str:
        return self.entity.entity_type

    @property
    def mol_type(self) -> int:
        return MOL_TYPE_ID[self.entity.entity_type]

    @property
    def cyclic_period(self) -> int:
        return len(self.residues) if self.entity.cyclic else 0

    @property
    def label(self) -> str:
        """What the chain is, for outputs: one-letter sequence, CCD code or SMILES."""
        return self.entity.sequence or self.entity.ccd or self.entity.smiles or ""


@dataclass
class Structure:
    chains: list[Chain]
    affinity_chain: str | None = None  # chain whose tokens get the affinity mask
    chain_by_name: dict[str, Chain] = field(init=False)

    def __post_init__(self) -> None:
        self.chain_by_name = {chain.name: chain for chain in self.chains}


def build_structure(target: Target, library: ComponentLibrary) -> Structure:
    """Chains, residues and reference chemistry of a target; InputError for anything unusable."""
    groups: dict[tuple, list[Entity]] = {}
    for entity in target.entities:
        key = (entity.entity_type, entity.sequence or entity.ccd or entity.smiles, entity.modifications, entity.cyclic)
        groups.setdefault(key, []).append(entity)

    chains: list[Chain] = []
    smiles_count = 0
    for entity_id, entities in enumerate(groups.values()):
        first = entities[0]
        if first.smiles:
            smiles_count += 1
        residues = _entity_residues(target, first, library, smiles_count)
        for sym_id, chain_id in enumerate(cid for entity in entities for cid in entity.chain_ids):
            chain = Chain(chain_id, first, entity_id, sym_id, len(chains), residues)
            chains.append(chain)
    return Structure(chains, affinity_chain=_affinity_binder(target, {c.name: c for c in chains}))


def _entity_residues(target: Target, entity: Entity, library: ComponentLibrary, smiles_count: int) -> list[Residue]:
    if entity.entity_type == "ligand":
        if entity.smiles:
            component = _smiles_component(target, entity, f"LIG{smiles_count}")
        else:
            component = _component(target, library, entity.ccd.upper(), f"ligand {entity.chain_ids[0]}")
        return [_nonstandard_residue(component, 0, drop_leaving=False)]
    names = [residue_name(entity.entity_type, letter) for letter in entity.sequence]
    for mod in entity.modifications:
        names[mod.position - 1] = mod.ccd.upper()
        _check_modification(target, entity, mod.position, mod.ccd.upper())
    residues = []
    for index, name in enumerate(names):
        name = "MET" if name == "MSE" else name  # selenomethionine is read as methionine
        where = f"chain {entity.chain_ids[0]} residue {index + 1}"
        component = _component(target, library, name, where)
        if name in TOKEN_ID:
            residues.append(_standard_residue(target, component, index, where))
        else:
            residues.append(_nonstandard_residue(component, index, drop_leaving=True))
    return residues


def _check_modification(target: Target, entity: Entity, position: int, code: str) -> None:
    """A modified residue must be a polymer building block; ions, waters and ligands are not."""
    kind = component_type(code)
    if kind is not None and not any(word in kind for word in ("LINKING", "PEPTIDE", "TERMINUS")):
        raise InputError(
            target.source, target.record,
            f"chain {entity.chain_ids[0]} residue {position}: modification {code} is a {kind.lower()} component, "
            "not a polymer residue (give it as a ligand, with a bond constraint if it is attached)",
        )  # fmt: skip


def _component(target: Target, library: ComponentLibrary, code: str, where: str) -> Component:
    try:
        component = library.get(code)
    except ImportError:
        raise InputError(target.source, target.record, f"{where}: reading {library.source} needs RDKit") from None
    except (ValueError, OSError) as error:
        raise InputError(target.source, target.record, f"{where}: CCD component {code} is unusable: {error}") from None
    if component is None:
        raise InputError(target.source, target.record, f"{where}: unknown CCD code {code!r} (not in {library.source})")
    return component


def _smiles_component(target: Target, entity: Entity, name: str) -> Component:
    try:
        from foldmill.features import rdkit_chem
    except ImportError:
        problem = f"ligand {entity.chain_ids[0]}: SMILES ligands need RDKit (pip install 'foldmill[smiles]')"
        raise InputError(target.source, target.record, problem) from None
    try:
        return rdkit_chem.smiles_component(entity.smiles, name)
    except ValueError as error:
        problem = f"ligand {entity.chain_ids[0]}: SMILES {entity.smiles!r}: {error}"
        raise InputError(target.source, target.record, problem) from None


def _standard_residue(target: Target, component: Component, index: int, where: str) -> Residue:
    layout = STANDARD_ATOMS[component.name]
    missing = [name for name in layout if name not in component.index_of]
    if missing:
        raise InputError(target.source, target.record, f"{where}: {component.name} lacks atom(s) {', '.join(missing)}")
    return Residue(
        name=component.name,
        index=index,
        type_id=TOKEN_ID[component.name],
        component=component,
        atoms=np.array([component.index_of[name] for name in layout], dtype=np.int64),
        is_standard=True,
        center=layout.index(center_atom(component.name)),
        disto=layout.index(disto_atom(component.name)),
    )


def _nonstandard_residue(component: Component, index: int, drop_leaving: bool) -> Residue:
    """A ligand or modified residue: its heavy atoms (minus leaving atoms when linked in a polymer)."""
    if component.n_atoms == 1 or not drop_leaving:
        atoms = np.arange(component.n_atoms)
    else:
        atoms = np.flatnonzero(~component.leaving)
    # The residue table stores UNK for every non-standard residue; the token class is per chain type.
    return Residue(component.name, index, UNKNOWN_TOKEN_ID["protein"], component, atoms, False, 0, 0)


def _affinity_binder(target: Target, chains: dict[str, Chain]) -> str | None:
    for prop in target.properties:
        affinity = prop.get("affinity") if isinstance(prop, dict) else None
        if affinity is None:
            continue
        binder = affinity.get("binder") if isinstance(affinity, dict) else None
        if not isinstance(binder, str) or binder not in chains:
            raise InputError(target.source, "properties", f"affinity binder {binder!r} is not a chain of the target")
        if chains[binder].entity_type != "ligand":
            raise InputError(target.source, "properties", f"affinity binder {binder} is not a ligand")
        return binder
    return None
