"""The target data model shared by every stage.

A `Target` is one folding job: one or more entities (protein, DNA, RNA chains or ligands),
each possibly present in several copies, plus optional templates and constraints.
Readers in `foldmill.io` turn user inputs into Targets; the worklist stores each Target as
canonical JSON (`Target.to_json`) so later stages rebuild it exactly (`Target.from_json`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from foldmill.errors import InputError
from foldmill.io.hashing import file_sha256

ENTITY_TYPES = ("protein", "dna", "rna", "ligand")

# One-letter codes accepted per polymer type. X/N are "unknown" residues (tokenized as UNK / N).
# U (selenocysteine), O (pyrrolysine) and the IUPAC ambiguity codes B, Z, J occur in real
# proteomes; Boltz maps them to UNK. Anything else (digits, '*' inside a chain, ...) is an error.
POLYMER_ALPHABETS: dict[str, frozenset[str]] = {
    "protein": frozenset("ACDEFGHIKLMNPQRSTVWYXUOBZJ"),
    "dna": frozenset("ACGTN"),
    "rna": frozenset("ACGUN"),
}

_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CCD_CODE = re.compile(r"^[A-Za-z0-9]{1,5}$")
_CHAIN_ID = re.compile(r"^[A-Za-z0-9]{1,4}$")


def check_safe_id(value: str, source: str, record: str | None, what: str = "target id") -> str:
    """Refuse ids that are not safe file names (path separators, '..', spaces, empty)."""
    if not _SAFE_ID.match(value or "") or ".." in value:
        raise InputError(
            source,
            record,
            f"{what} {value!r} is not a safe file name "
            "(use letters, digits, '.', '_', '-'; at most 128 characters; no '..' or '/')",
        )
    return value


@dataclass(frozen=True)
class Modification:
    """A modified residue: 1-based position in the chain and the CCD code replacing it."""

    position: int
    ccd: str


@dataclass(frozen=True)
class Entity:
    """One molecular entity, present once per chain id in `chain_ids`."""

    entity_type: str
    chain_ids: tuple[str, ...]
    sequence: str | None = None  # polymers
    ccd: str | None = None  # ligands given by CCD code
    smiles: str | None = None  # ligands given by SMILES
    msa: str | None = None  # path to an MSA, "empty" for single-sequence, None = stage/search one
    modifications: tuple[Modification, ...] = ()
    cyclic: bool = False

    @property
    def copies(self) -> int:
        return len(self.chain_ids)

    @property
    def is_polymer(self) -> bool:
        return self.entity_type != "ligand"

    def sequence_hash(self) -> str:
        """Hash of what determines this entity's MSA (type + sequence); ligands hash their chemistry."""
        payload = f"{self.entity_type}:{self.sequence or self.ccd or self.smiles}"
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Template:
    """A user-supplied template structure for some chains of the target."""

    path: str
    chain_ids: tuple[str, ...] = ()  # query chains this template applies to (empty = all proteins)
    template_chain_ids: tuple[str, ...] = ()  # chains in the template file
    force: bool = False
    threshold: float | None = None


@dataclass(frozen=True)
class Target:
    """One folding job."""

    target_id: str
    entities: tuple[Entity, ...]
    templates: tuple[Template, ...] = ()
    constraints: tuple[dict[str, Any], ...] = ()
    properties: tuple[dict[str, Any], ...] = ()
    source: str = ""
    record: str = ""  # where in `source` this target came from (line, record number)

    @property
    def chain_ids(self) -> list[str]:
        return [cid for entity in self.entities for cid in entity.chain_ids]

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace; equal targets give equal strings."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Target:
        data = json.loads(text)
        return cls(
            target_id=data["target_id"],
            entities=tuple(
                Entity(
                    entity_type=e["entity_type"],
                    chain_ids=tuple(e["chain_ids"]),
                    sequence=e["sequence"],
                    ccd=e["ccd"],
                    smiles=e["smiles"],
                    msa=e["msa"],
                    modifications=tuple(Modification(**m) for m in e["modifications"]),
                    cyclic=e["cyclic"],
                )
                for e in data["entities"]
            ),
            templates=tuple(
                Template(
                    path=t["path"],
                    chain_ids=tuple(t["chain_ids"]),
                    template_chain_ids=tuple(t["template_chain_ids"]),
                    force=t["force"],
                    threshold=t["threshold"],
                )
                for t in data["templates"]
            ),
            constraints=tuple(data["constraints"]),
            properties=tuple(data["properties"]),
            source=data["source"],
            record=data["record"],
        )

    def content_hash(self) -> str:
        """Stable hash of everything that determines the prediction.

        The id and where the target came from are excluded; MSA and template files count by
        their content, so moving a file does not change the hash but editing it does.
        """
        data = self.to_dict()
        data.pop("target_id")
        data.pop("source")
        data.pop("record")
        for entity in data["entities"]:
            if entity["msa"] not in (None, "empty"):
                entity["msa"] = _file_digest(entity["msa"])
        for template in data["templates"]:
            template["path"] = _file_digest(template["path"])
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _plain(value: Any) -> Any:
    """`value` as JSON data: dataclasses as dicts, tuples as lists. `dataclasses.asdict` without its
    deep copies, which made it most of the cost of planning a long worklist."""
    if hasattr(value, "__dataclass_fields__"):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _file_digest(path: str) -> str:
    return "sha256:" + file_sha256(path)


def validate_entity(entity: Entity, source: str, record: str) -> None:
    """Check one entity; raise InputError naming the problem."""
    if entity.entity_type not in ENTITY_TYPES:
        raise InputError(
            source, record, f"unknown entity type {entity.entity_type!r} (expected one of {', '.join(ENTITY_TYPES)})"
        )
    if not entity.chain_ids:
        raise InputError(source, record, f"{entity.entity_type} entity has no chain id")
    for chain_id in entity.chain_ids:
        if not _CHAIN_ID.match(chain_id):
            raise InputError(source, record, f"chain id {chain_id!r} must be 1-4 letters or digits")
    if entity.is_polymer:
        if not entity.sequence:
            raise InputError(source, record, f"{entity.entity_type} chain {entity.chain_ids[0]} has an empty sequence")
        alphabet = POLYMER_ALPHABETS[entity.entity_type]
        bad = sorted(set(entity.sequence) - alphabet)
        if bad:
            position = min(entity.sequence.index(letter) for letter in bad) + 1
            raise InputError(
                source,
                record,
                f"{entity.entity_type} chain {entity.chain_ids[0]} has unknown residue letter(s) "
                f"{''.join(bad)!r} (first at position {position})",
            )
        for mod in entity.modifications:
            if not 1 <= mod.position <= len(entity.sequence):
                raise InputError(
                    source, record, f"modification at position {mod.position} is outside chain {entity.chain_ids[0]}"
                )
            if not _CCD_CODE.match(mod.ccd):
                raise InputError(source, record, f"modification CCD code {mod.ccd!r} is malformed")
        if entity.msa not in (None, "empty") and not Path(entity.msa).is_file():
            raise InputError(source, record, f"MSA file {entity.msa} for chain {entity.chain_ids[0]} does not exist")
    else:
        if bool(entity.ccd) == bool(entity.smiles):
            raise InputError(source, record, f"ligand {entity.chain_ids[0]} needs exactly one of 'ccd' or 'smiles'")
        if entity.ccd and not _CCD_CODE.match(entity.ccd):
            raise InputError(source, record, f"CCD code {entity.ccd!r} is malformed")


def validate_target(target: Target) -> Target:
    """Check a whole target: id, entities, chain ids unique, templates present."""
    source, record = target.source, target.record
    check_safe_id(target.target_id, source, record)
    if not target.entities:
        raise InputError(source, record, f"target {target.target_id} has no sequences")
    seen: set[str] = set()
    for entity in target.entities:
        validate_entity(entity, source, record)
        for chain_id in entity.chain_ids:
            if chain_id in seen:
                raise InputError(source, record, f"chain id {chain_id!r} is used twice in target {target.target_id}")
            seen.add(chain_id)
    for template in target.templates:
        if not Path(template.path).is_file():
            raise InputError(source, record, f"template file {template.path} does not exist")
        unknown = sorted(set(template.chain_ids) - seen)
        if unknown:
            raise InputError(source, record, f"template refers to unknown chain(s) {', '.join(unknown)}")
    return target
