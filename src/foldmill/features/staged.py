"""What staging produced for one target: MSAs by `msa_key` and template alignments by chain.

Two ways to get it:
- `StagedInputs.from_manifests(OUTDIR, target)` in the workflow: reads
  `OUTDIR/staged/msa_manifest.tsv` (chain_hash, given_msa, path, ...), `msa_rejects.tsv` and
  `templates_manifest.tsv` (target_id, chain_id, path, force, threshold, ...). A chain's MSA is the
  one staged for its sequence together with the MSA its own input named (msa.staging.msa_key),
  never one given with the same sequence by another target; in a complex whose chains were
  searched, the MSA staged for the complex (msa.staging.complex_key: paired rows first) if any;
- `StagedInputs.from_target(target)` for a direct `foldmill fold` on an input file: MSAs are read
  from the paths the target names (A3M / CSV / Stockholm), templates aligned on the spot.
Chains with neither a staged MSA nor an MSA file are featurized single-sequence.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from foldmill.errors import InputError
from foldmill.features.template_features import ChainTemplate
from foldmill.io.targets import Entity, Target
from foldmill.msa.parse import read_msa
from foldmill.msa.staging import MSAKey, msa_key, read_msa_manifest, read_msa_rejects, staged_keys
from foldmill.msa.types import MSA
from foldmill.templates.types import TemplateAlignment

MSA_MANIFEST = "msa_manifest.tsv"
MSA_REJECTS = "msa_rejects.tsv"
TEMPLATES_MANIFEST = "templates_manifest.tsv"


@dataclass
class StagedInputs:
    msa_paths: dict[MSAKey, Path] = field(default_factory=dict)  # msa_key -> staged MSA (.npz)
    msa_rejects: dict[MSAKey, str] = field(default_factory=dict)  # msa_key -> why staging refused it
    templates: list[ChainTemplate] = field(default_factory=list)

    @classmethod
    def from_target(cls, target: Target) -> StagedInputs:
        """Inputs of a target used directly: no staged MSAs, user templates aligned now."""
        if not target.templates:
            return cls()
        from foldmill.templates.staging import user_template_alignments

        aligned = user_template_alignments(target, {})
        return cls(templates=[ChainTemplate(*item) for item in aligned])

    @classmethod
    def from_manifests(cls, source: str | Path | Mapping[str, str | Path], target: Target) -> StagedInputs:
        """Inputs of `target` from staging manifests.

        `source` is the workflow's OUTDIR (manifests under OUTDIR/staged/), the staged directory
        itself, or a mapping with keys "msa", "msa_rejects", "templates" naming manifest files.
        """
        paths = _manifest_paths(source)
        staged = _keyed(paths.get("msa"), "path")
        rejected = _keyed(paths.get("msa_rejects"), "problem")
        msa_paths, rejects = {}, {}
        for entity in target.entities:
            if not entity.is_polymer:
                continue
            for lookup in staged_keys(target, entity):
                if lookup in rejected:
                    rejects[msa_key(entity)] = rejected[lookup]
                    break
                if lookup in staged:
                    msa_paths[msa_key(entity)] = Path(staged[lookup])
                    break
        templates = []
        for row in _rows(paths.get("templates"), target.target_id):
            alignment = TemplateAlignment.load(row["path"])
            threshold = float(row["threshold"]) if row["threshold"] != "" else None
            templates.append(ChainTemplate(str(row["chain_id"]), alignment, _truthy(row["force"]), threshold))
        return cls(msa_paths, rejects, templates)

    def msa(self, target: Target, entity: Entity, max_depth: int) -> MSA | None:
        """The MSA of a protein entity (None = single sequence); InputError if unusable."""
        key = msa_key(entity)
        if key in self.msa_rejects:
            problem = f"chain {entity.chain_ids[0]}: MSA rejected by staging: {self.msa_rejects[key]}"
            raise InputError(target.source, target.record, problem)
        if key in self.msa_paths:
            path = self.msa_paths[key]
            try:
                msa = MSA.load(path)
            except (OSError, ValueError, KeyError) as error:
                raise InputError(str(path), None, f"cannot read staged MSA: {error}") from None
            if msa.length != len(entity.sequence or ""):
                residues = len(entity.sequence or "")
                problem = f"staged MSA has {msa.length} columns, chain {entity.chain_ids[0]} has {residues} residues"
                raise InputError(str(path), None, problem)
        elif entity.msa not in (None, "empty"):
            msa = read_msa(entity.msa, entity.sequence, max_depth)
        else:
            return None
        return msa if msa.depth <= max_depth else msa.select_rows(np.arange(max_depth))


def _manifest_paths(source: str | Path | Mapping[str, str | Path]) -> dict[str, Path]:
    if isinstance(source, Mapping):
        return {key: Path(value) for key, value in source.items()}
    folder = Path(source)
    if not (folder / MSA_MANIFEST).exists() and (folder / "staged").is_dir():
        folder = folder / "staged"
    return {"msa": folder / MSA_MANIFEST, "msa_rejects": folder / MSA_REJECTS, "templates": folder / TEMPLATES_MANIFEST}


def _keyed(path: Path | None, column: str) -> dict[tuple[str, str, str], str]:
    if path is None or not path.is_file():
        return {}
    return _read_keyed(str(path), os.stat(path).st_mtime_ns, column)


@functools.lru_cache(maxsize=16)
def _read_keyed(path: str, _mtime: int, column: str) -> dict[tuple[str, str, str], str]:
    """(msa_key, complex) -> `column` ("path" of the MSA manifest, "problem" of the MSA rejects); cached
    per file version (a proteome run featurizes many targets)."""
    table = read_msa_manifest(path) if column == "path" else read_msa_rejects(path)
    return dict(zip(zip(table["chain_hash"], table["given_msa"], table["complex"]), table[column]))


def _rows(path: Path | None, target_id: str) -> list[dict]:
    if path is None or not path.is_file():
        return []
    table = _read_templates(str(path), os.stat(path).st_mtime_ns)
    return table.get(target_id, [])


@functools.lru_cache(maxsize=4)
def _read_templates(path: str, _mtime: int) -> dict[str, list[dict]]:
    table = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    missing = [c for c in ("target_id", "chain_id", "path", "force", "threshold") if c not in table.columns]
    if missing:
        raise InputError(path, "header", f"missing column(s) {', '.join(missing)}")
    grouped: dict[str, list[dict]] = {}
    for row in table.to_dict("records"):
        grouped.setdefault(row["target_id"], []).append(row)
    return grouped


def _truthy(value: object) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes")
