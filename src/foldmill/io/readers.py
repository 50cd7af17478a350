"""Readers that turn user inputs into Targets.

Three input kinds are accepted (see docs in config/README.md):
- a proteome FASTA: one monomer protein target per record;
- a Boltz FASTA (deprecated Boltz form, headers `>CHAIN|TYPE|MSA_PATH`): one target per file;
- a target sheet (TSV/CSV, one row per entity, rows grouped by target_id);
- a Boltz YAML file (schema version 1): one target per file.

Relative MSA and template paths are resolved against the directory of the file naming them.
Every problem is raised as `InputError` naming the file, the record and what is wrong.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from foldmill.errors import InputError
from foldmill.io.targets import ENTITY_TYPES, Entity, Modification, Target, Template, check_safe_id

FASTA_SUFFIXES = {".fasta", ".fa", ".faa", ".fas"}
SHEET_SUFFIXES = {".tsv", ".csv"}
YAML_SUFFIXES = {".yaml", ".yml"}

_BOLTZ_FASTA_HEADER = re.compile(r"^([A-Za-z0-9]{1,4})\|(protein|dna|rna|smiles|ccd)(\|(.*))?$", re.IGNORECASE)
_UNIPROT_HEADER = re.compile(r"^(?:sp|tr)\|([A-Za-z0-9_.-]+)\|")


def read_inputs(path: Path) -> Iterator[Target | InputError]:
    """Yield the targets in one input file, or an InputError for each bad record.

    Errors are yielded rather than raised so that a caller can skip bad records and go on;
    a file that cannot be read at all yields one error.
    """
    suffix = path.suffix.lower()
    try:
        if suffix in FASTA_SUFFIXES:
            yield from _read_fasta(path)
        elif suffix in SHEET_SUFFIXES:
            yield from _read_sheet(path)
        elif suffix in YAML_SUFFIXES:
            yield _read_boltz_yaml(path)
        else:
            raise InputError(
                str(path), None, "unknown input type (expected .fasta/.fa/.faa, .tsv/.csv or .yaml/.yml)"
            )
    except InputError as error:
        yield error
    except (OSError, UnicodeDecodeError) as error:
        yield InputError(str(path), None, f"cannot read file: {error}")


def _resolve(base: Path, value: str | None) -> str | None:
    """Resolve a path relative to the file that names it; keep the 'empty' MSA keyword."""
    if value is None or value == "" or value == "empty":
        return value or None
    candidate = Path(value)
    if not candidate.is_absolute():
        candidate = base.parent / candidate
    return str(candidate.resolve())


def _fasta_records(path: Path) -> Iterator[tuple[int, str, str]]:
    """(line number of header, header, sequence) for each record."""
    header: str | None = None
    header_line = 0
    chunks: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, start=1):
            line = raw.strip()
            if not line:
                continue
            if line.startswith(">"):
                if header is not None:
                    yield header_line, header, "".join(chunks)
                header, header_line, chunks = line[1:].strip(), number, []
            elif header is None:
                raise InputError(str(path), f"line {number}", "sequence data before the first '>' header")
            else:
                chunks.append(line.replace(" ", ""))
    if header is None:
        raise InputError(str(path), None, "no FASTA records found")
    yield header_line, header, "".join(chunks)


def _read_fasta(path: Path) -> Iterator[Target | InputError]:
    records = list(_fasta_records(path))
    if all(_BOLTZ_FASTA_HEADER.match(header) for _, header, _ in records):
        yield _boltz_fasta_target(path, records)
        return
    for line, header, sequence in records:
        record = f"line {line} ({header.split()[0] if header else 'empty header'})"
        try:
            target_id = _fasta_target_id(path, record, header)
            # A trailing stop codon is common in proteome translations; it is not a residue.
            sequence = sequence.upper().removesuffix("*")
            yield Target(
                target_id=target_id,
                entities=(Entity("protein", ("A",), sequence=sequence),),
                source=str(path),
                record=record,
            )
        except InputError as error:
            yield error


def _fasta_target_id(path: Path, record: str, header: str) -> str:
    if not header:
        raise InputError(str(path), record, "empty FASTA header")
    uniprot = _UNIPROT_HEADER.match(header)
    target_id = uniprot.group(1) if uniprot else header.split()[0]
    return check_safe_id(target_id, str(path), record)


def _boltz_fasta_target(path: Path, records: list[tuple[int, str, str]]) -> Target:
    entities = []
    for line, header, body in records:
        match = _BOLTZ_FASTA_HEADER.match(header)
        assert match  # checked by the caller
        chain_id, kind, msa = match.group(1), match.group(2).lower(), match.group(4)
        if kind in ("smiles", "ccd"):
            entity = Entity("ligand", (chain_id,), **{kind: body.strip()})
        else:
            entity = Entity(kind, (chain_id,), sequence=body.upper(), msa=_resolve(path, msa))
        entities.append(entity)
    target_id = check_safe_id(path.stem, str(path), "file name")
    return Target(target_id=target_id, entities=tuple(entities), source=str(path), record="file")


def _split_list(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in re.split(r"[,;\s]+", value) if part.strip())


_SHEET_COLUMNS = {"target_id", "entity_type", "sequence", "ccd", "smiles", "copies", "chain_ids", "msa", "template", "template_chain_ids", "cyclic"}


def _read_sheet(path: Path) -> Iterator[Target | InputError]:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle, delimiter=delimiter)
        columns = set(reader.fieldnames or [])
        missing = {"target_id", "entity_type"} - columns
        if missing:
            raise InputError(str(path), "header", f"missing column(s) {', '.join(sorted(missing))}")
        unknown = columns - _SHEET_COLUMNS
        if unknown:
            raise InputError(str(path), "header", f"unknown column(s) {', '.join(sorted(unknown))}")
        grouped: dict[str, list[tuple[int, dict[str, str]]]] = {}
        for number, row in enumerate(reader, start=2):
            target_id = (row.get("target_id") or "").strip()
            grouped.setdefault(target_id, []).append((number, row))
    for target_id, rows in grouped.items():
        try:
            yield _sheet_target(path, target_id, rows)
        except InputError as error:
            yield error


def _sheet_target(path: Path, target_id: str, rows: list[tuple[int, dict[str, str]]]) -> Target:
    first_line = rows[0][0]
    check_safe_id(target_id, str(path), f"line {first_line}")
    entities: list[Entity] = []
    templates: list[Template] = []
    next_chain = 0
    for number, row in rows:
        record = f"line {number} ({target_id})"
        cell = {key: (value or "").strip() for key, value in row.items() if key}
        entity_type = cell.get("entity_type", "").lower()
        if entity_type not in ENTITY_TYPES:
            raise InputError(
                str(path), record, f"unknown entity type {entity_type!r} (expected one of {', '.join(ENTITY_TYPES)})"
            )
        copies_text = cell.get("copies") or "1"
        if not copies_text.isdigit() or int(copies_text) < 1:
            raise InputError(str(path), record, f"copies must be a positive integer, got {copies_text!r}")
        copies = int(copies_text)
        chain_ids = _split_list(cell.get("chain_ids", ""))
        if not chain_ids:
            chain_ids = tuple(_auto_chain_id(next_chain + i) for i in range(copies))
        elif len(chain_ids) != copies and cell.get("copies"):
            raise InputError(str(path), record, f"{len(chain_ids)} chain ids given for {copies} copies")
        next_chain += len(chain_ids)
        if entity_type == "ligand":
            entity = Entity("ligand", chain_ids, ccd=cell.get("ccd") or None, smiles=cell.get("smiles") or None)
        else:
            entity = Entity(
                entity_type,
                chain_ids,
                sequence=cell.get("sequence", "").upper(),
                msa=_resolve(path, cell.get("msa")),
                cyclic=cell.get("cyclic", "").lower() in ("1", "true", "yes"),
            )
        entities.append(entity)
        if cell.get("template"):
            templates.append(
                Template(
                    path=_resolve(path, cell["template"]) or "",
                    chain_ids=chain_ids,
                    template_chain_ids=_split_list(cell.get("template_chain_ids", "")),
                )
            )
    return Target(
        target_id=target_id,
        entities=tuple(entities),
        templates=tuple(templates),
        source=str(path),
        record=f"line {first_line} ({target_id})",
    )


def _auto_chain_id(index: int) -> str:
    """A, B, ..., Z, AA, AB, ... like spreadsheet columns."""
    name = ""
    index += 1
    while index:
        index, remainder = divmod(index - 1, 26)
        name = chr(ord("A") + remainder) + name
    return name


_YAML_ENTITY_KEYS = {
    "protein": {"id", "sequence", "msa", "modifications", "cyclic"},
    "dna": {"id", "sequence", "modifications", "cyclic"},
    "rna": {"id", "sequence", "modifications", "cyclic"},
    "ligand": {"id", "smiles", "ccd"},
}


def _read_boltz_yaml(path: Path) -> Target:
    source = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else None
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise InputError(source, where, f"malformed YAML: {problem}") from None
    if not isinstance(data, dict):
        raise InputError(source, None, "expected a YAML mapping with a 'sequences' list")
    version = data.get("version", 1)
    if version != 1:
        raise InputError(source, "version", f"unsupported Boltz YAML version {version!r} (expected 1)")
    unknown = set(data) - {"version", "sequences", "constraints", "templates", "properties"}
    if unknown:
        raise InputError(source, None, f"unknown top-level key(s) {', '.join(sorted(unknown))}")
    sequences = data.get("sequences")
    if not isinstance(sequences, list) or not sequences:
        raise InputError(source, "sequences", "'sequences' must be a non-empty list")
    entities = tuple(_yaml_entity(path, index, item) for index, item in enumerate(sequences, start=1))
    templates = tuple(_yaml_template(path, index, item) for index, item in enumerate(data.get("templates") or [], start=1))
    constraints = data.get("constraints") or []
    properties = data.get("properties") or []
    if not isinstance(constraints, list) or not all(isinstance(c, dict) and len(c) == 1 for c in constraints):
        raise InputError(source, "constraints", "each constraint must be a mapping with one key (bond, pocket, contact)")
    for constraint in constraints:
        kind = next(iter(constraint))
        if kind not in ("bond", "pocket", "contact"):
            raise InputError(source, "constraints", f"unknown constraint type {kind!r}")
    target_id = check_safe_id(path.stem, source, "file name")
    return Target(
        target_id=target_id,
        entities=entities,
        templates=templates,
        constraints=tuple(constraints),
        properties=tuple(properties),
        source=source,
        record="file",
    )


def _yaml_entity(path: Path, index: int, item: Any) -> Entity:
    source, record = str(path), f"sequences[{index}]"
    if not isinstance(item, dict) or len(item) != 1:
        raise InputError(source, record, "each entry needs exactly one of protein, dna, rna, ligand")
    kind, body = next(iter(item.items()))
    if kind not in _YAML_ENTITY_KEYS:
        raise InputError(source, record, f"unknown entity type {kind!r} (expected one of {', '.join(ENTITY_TYPES)})")
    if not isinstance(body, dict):
        raise InputError(source, record, f"{kind} entry must be a mapping")
    unknown = set(body) - _YAML_ENTITY_KEYS[kind]
    if unknown:
        raise InputError(source, record, f"unknown key(s) {', '.join(sorted(unknown))} for {kind}")
    raw_ids = body.get("id")
    chain_ids = tuple(str(v) for v in raw_ids) if isinstance(raw_ids, list) else ((str(raw_ids),) if raw_ids is not None else ())
    if not chain_ids:
        raise InputError(source, record, f"{kind} entry has no 'id'")
    if kind == "ligand":
        return Entity("ligand", chain_ids, ccd=_opt_str(body.get("ccd")), smiles=_opt_str(body.get("smiles")))
    modifications = []
    for mod in body.get("modifications") or []:
        if not isinstance(mod, dict) or "position" not in mod or "ccd" not in mod:
            raise InputError(source, record, "each modification needs 'position' and 'ccd'")
        try:
            modifications.append(Modification(int(mod["position"]), str(mod["ccd"])))
        except (TypeError, ValueError):
            raise InputError(source, record, f"modification position {mod['position']!r} is not an integer") from None
    sequence = body.get("sequence")
    if sequence is not None and not isinstance(sequence, str):
        raise InputError(source, record, "sequence must be a string")
    return Entity(
        kind,
        chain_ids,
        sequence=(sequence or "").replace(" ", "").upper(),
        msa=_resolve(path, _opt_str(body.get("msa"))),
        modifications=tuple(modifications),
        cyclic=bool(body.get("cyclic", False)),
    )


def _yaml_template(path: Path, index: int, item: Any) -> Template:
    source, record = str(path), f"templates[{index}]"
    if not isinstance(item, dict):
        raise InputError(source, record, "each template must be a mapping")
    file_value = item.get("cif") or item.get("pdb")
    if not file_value:
        raise InputError(source, record, "template needs 'cif' or 'pdb'")

    def ids(key: str) -> tuple[str, ...]:
        value = item.get(key)
        if value is None:
            return ()
        return tuple(str(v) for v in value) if isinstance(value, list) else (str(value),)

    threshold = item.get("threshold")
    return Template(
        path=_resolve(path, str(file_value)) or "",
        chain_ids=ids("chain_id"),
        template_chain_ids=ids("template_id"),
        force=bool(item.get("force", False)),
        threshold=float(threshold) if threshold is not None else None,
    )


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
