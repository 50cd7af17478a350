"""User constraints (Boltz YAML `constraints:`) resolved against the tokenized target.

- bond:    atom1/atom2 = [chain, residue number (1-based), atom name]; a covalent bond, e.g. a
           ligand attached to a cysteine or a cyclizing link.
- pocket:  binder = chain; contacts = [[chain, residue number or, for ligands, atom name], ...];
           max_distance (Å, default 6), force (apply the inference potential, default false).
- contact: token1/token2 = [chain, residue number or ligand atom name]; max_distance, force.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from foldmill.errors import InputError
from foldmill.features.tokenize import Tokenized
from foldmill.io.targets import Target

DEFAULT_MAX_DISTANCE = 6.0

# A token reference: (asym_id, residue index) for polymers, (asym_id, global atom index) for ligands.
TokenRef = tuple[int, int]


@dataclass(frozen=True)
class Connection:
    chain_1: int  # asym ids
    chain_2: int
    residue_1: int  # residue indices within their chains
    residue_2: int
    atom_1: int  # global atom indices
    atom_2: int


@dataclass(frozen=True)
class PocketConstraint:
    binder: int  # asym id of the binder chain
    contacts: tuple[TokenRef, ...]
    max_distance: float
    force: bool


@dataclass(frozen=True)
class ContactConstraint:
    token_1: TokenRef
    token_2: TokenRef
    max_distance: float
    force: bool


@dataclass
class Constraints:
    connections: list[Connection] = field(default_factory=list)
    pockets: list[PocketConstraint] = field(default_factory=list)
    contacts: list[ContactConstraint] = field(default_factory=list)


def resolve_constraints(target: Target, tokenized: Tokenized) -> Constraints:
    """Constraints of `target` in token and atom indices; InputError naming the bad entry."""
    resolved = Constraints()
    if not target.constraints:
        return resolved
    resolver = _Resolver(target, tokenized)
    for number, item in enumerate(target.constraints, start=1):
        kind, body = next(iter(item.items()))
        resolver.record = f"constraints[{number}] ({kind})"
        if not isinstance(body, dict):
            resolver.fail("must be a mapping")
        if kind == "bond":
            resolved.connections.append(resolver.bond(body))
        elif kind == "pocket":
            resolved.pockets.append(resolver.pocket(body))
        elif kind == "contact":
            resolved.contacts.append(resolver.contact(body))
        else:
            resolver.fail(f"unknown constraint type {kind!r}")
    return resolved


class _Resolver:
    def __init__(self, target: Target, tokenized: Tokenized) -> None:
        self.source = target.source
        self.record = "constraints"
        self.chains = tokenized.structure.chain_by_name
        self.atoms: dict[tuple[str, int, str], int] = {}
        for placed in tokenized.residues:
            residue = placed.residue
            for k, atom in enumerate(residue.atoms):
                name = residue.component.atom_names[atom]
                self.atoms[(placed.chain.name, residue.index, name)] = placed.atom_start + k

    def fail(self, problem: str):
        raise InputError(self.source, self.record, problem)

    def _chain(self, name: Any):
        if str(name) not in self.chains:
            self.fail(f"unknown chain {name!r}")
        return self.chains[str(name)]

    def _atom(self, spec: Any) -> tuple[int, int, int]:
        if not isinstance(spec, (list, tuple)) or len(spec) != 3:
            self.fail(f"atom must be [chain, residue number, atom name], got {spec!r}")
        chain = self._chain(spec[0])
        number = self._residue_number(spec[1])
        key = (chain.name, number - 1, str(spec[2]))
        if key not in self.atoms:
            self.fail(f"chain {chain.name} residue {number} has no atom {spec[2]!r}")
        return chain.asym_id, number - 1, self.atoms[key]

    def _residue_number(self, value: Any) -> int:
        try:
            return int(value)
        except (TypeError, ValueError):
            self.fail(f"residue number {value!r} is not an integer")

    def _token(self, spec: Any) -> TokenRef:
        if not isinstance(spec, (list, tuple)) or len(spec) != 2:
            self.fail(f"token must be [chain, residue number or ligand atom name], got {spec!r}")
        chain = self._chain(spec[0])
        if chain.entity_type == "ligand":
            key = (chain.name, 0, str(spec[1]))
            if key not in self.atoms:
                self.fail(f"ligand {chain.name} has no atom {spec[1]!r}")
            return chain.asym_id, self.atoms[key]
        number = self._residue_number(spec[1])
        if not 1 <= number <= len(chain.residues):
            self.fail(f"residue {number} is outside chain {chain.name} (1-{len(chain.residues)})")
        return chain.asym_id, number - 1

    def _distance(self, body: dict) -> float:
        try:
            return float(body.get("max_distance", DEFAULT_MAX_DISTANCE))
        except (TypeError, ValueError):
            self.fail(f"max_distance {body.get('max_distance')!r} is not a number")

    def bond(self, body: dict) -> Connection:
        if "atom1" not in body or "atom2" not in body:
            self.fail("bond needs atom1 and atom2")
        chain_1, residue_1, atom_1 = self._atom(body["atom1"])
        chain_2, residue_2, atom_2 = self._atom(body["atom2"])
        return Connection(chain_1, chain_2, residue_1, residue_2, atom_1, atom_2)

    def pocket(self, body: dict) -> PocketConstraint:
        if "binder" not in body or "contacts" not in body:
            self.fail("pocket needs binder and contacts")
        binder = self._chain(body["binder"]).asym_id
        contacts = tuple(self._token(spec) for spec in body["contacts"] or [])
        return PocketConstraint(binder, contacts, self._distance(body), bool(body.get("force", False)))

    def contact(self, body: dict) -> ContactConstraint:
        if "token1" not in body or "token2" not in body:
            self.fail("contact needs token1 and token2")
        token_1, token_2 = self._token(body["token1"]), self._token(body["token2"])
        return ContactConstraint(token_1, token_2, self._distance(body), bool(body.get("force", False)))
