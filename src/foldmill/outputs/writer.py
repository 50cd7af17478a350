"""Write one finished target: OUTDIR/predictions/<target_id>/, all or nothing.

Files (rank 0 = best sample by Boltz's confidence_score; Boltz's names):
  <id>_model_<rank>.cif               ModelCIF-style mmCIF (pLDDT as B-factor and local QA metric)
  <id>_model_<rank>.pdb               only with write_pdb, when PDB can hold it (B-factor = pLDDT)
  confidence_<id>_model_<rank>.json   Boltz's confidence summary
  plddt_/pae_/pde_<id>_model_<rank>.npz   arrays (keys plddt, pae, pde), compressed
  prediction_<id>.json                foldmill's record: chains, ranking, interface PAE, provenance
  done                                written last
The directory is assembled under a temporary name and renamed into place, so a target
directory that exists is complete; an older one (a retry) is replaced.
"""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from foldmill import __version__
from foldmill.errors import FoldmillError
from foldmill.outputs.confidence import confidence_summary, interface_pae
from foldmill.outputs.layout import Chain, chain_layout
from foldmill.outputs.modelcif import RankedModel, model_cif_text
from foldmill.outputs.prediction import Prediction
from foldmill.outputs.staging import staging_directory
from foldmill.outputs.structure import build_structure, pdb_limitation, pdb_text
from foldmill.outputs.validation import validate_prediction

log = logging.getLogger(__name__)

DONE_MARKER = "done"


def predictions_dir(outdir: str | os.PathLike[str]) -> Path:
    return Path(outdir) / "predictions"


def target_dir(outdir: str | os.PathLike[str], target_id: str) -> Path:
    """OUTDIR/predictions/<target_id>, refusing any id that would resolve elsewhere."""
    parent = predictions_dir(outdir).resolve()
    path = (parent / target_id).resolve()
    if path.parent != parent:
        raise FoldmillError(f"target id {target_id!r} would write outside {parent}")
    return path


def model_files(target_id: str, rank: int) -> dict[str, str]:
    """File names of one ranked model, by kind."""
    stem = f"{target_id}_model_{rank}"
    return {
        "structure": f"{stem}.cif",
        "pdb": f"{stem}.pdb",
        "confidence": f"confidence_{stem}.json",
        "plddt": f"plddt_{stem}.npz",
        "pae": f"pae_{stem}.npz",
        "pde": f"pde_{stem}.npz",
    }


def record_name(target_id: str) -> str:
    return f"prediction_{target_id}.json"


def ranked_samples(prediction: Prediction, top_k: int | None = None) -> list[int]:
    """Sample indices best first by confidence_score (ties keep sampling order), at most top_k."""
    order = np.argsort(-np.asarray(prediction.confidence_score, dtype=np.float64), kind="stable").tolist()
    return order if top_k is None else order[: max(1, top_k)]


def write_prediction(prediction: Prediction, outdir: Path, top_k: int | None = None, write_pdb: bool = False) -> Path:
    """Validate and write `prediction`; returns its directory. Raises InvalidPrediction when unsound."""
    validate_prediction(prediction)
    target_id = str(prediction.target_id)
    final = target_dir(outdir, target_id)
    chains = chain_layout(prediction)
    samples = ranked_samples(prediction, top_k)
    pdb_skipped = pdb_limitation(chains, int(prediction.coords.shape[1])) if write_pdb else None
    if pdb_skipped:
        log.warning("%s: no PDB file: %s", target_id, pdb_skipped)
    with_pdb = write_pdb and not pdb_skipped
    with staging_directory(final) as staging:
        # One thread per model: their arrays' compression (zlib, which releases the GIL) is most of a
        # large target's writing (~8 of 15 s at 2,467 tokens, 5 models, one after the other).
        with ThreadPoolExecutor(max_workers=len(samples)) as pool:
            models = list(
                pool.map(
                    lambda ranked: _write_model(staging, prediction, chains, ranked, with_pdb),
                    [RankedModel(sample, rank, len(samples)) for rank, sample in enumerate(samples)],
                )
            )
        record = _target_record(prediction, chains, models)
        if pdb_skipped:
            record["pdb_skipped"] = pdb_skipped
        text = json.dumps(record, indent=2, default=_plain)
        (staging / record_name(target_id)).write_text(text + "\n", encoding="utf-8")
        (staging / DONE_MARKER).write_text("", encoding="utf-8")
    return final


def _write_model(
    directory: Path, prediction: Prediction, chains: list[Chain], ranked: RankedModel, write_pdb: bool
) -> dict[str, object]:
    target_id, sample = str(prediction.target_id), ranked.sample
    files = model_files(target_id, ranked.rank)
    structure = build_structure(prediction, chains, sample, name=target_id)
    (directory / files["structure"]).write_text(model_cif_text(prediction, chains, ranked, structure), encoding="utf-8")
    if write_pdb:
        (directory / files["pdb"]).write_text(pdb_text(structure), encoding="utf-8")
    else:
        del files["pdb"]
    summary = confidence_summary(prediction, sample)
    (directory / files["confidence"]).write_text(json.dumps(summary, indent=4) + "\n", encoding="utf-8")
    for key in ("plddt", "pae", "pde"):
        np.savez_compressed(directory / files[key], **{key: np.asarray(getattr(prediction, key)[sample])})
    pae_value, contacts = interface_pae(prediction, chains, sample)
    return {
        "rank": ranked.rank,
        "sample": sample,
        "best": ranked.rank == 0,
        "confidence_score": summary["confidence_score"],
        "interface_pae": pae_value,
        "interface_contacts": contacts,
        "files": files,
    }


def _target_record(prediction: Prediction, chains: list[Chain], models: list[dict[str, object]]) -> dict[str, object]:
    return {
        "target_id": str(prediction.target_id),
        "foldmill_version": __version__,
        "provenance": prediction.provenance,
        "runtime_seconds": float(prediction.runtime_seconds),
        "n_samples": prediction.n_samples,
        "n_tokens": len(prediction.token_chain_ids),
        "n_atoms": int(prediction.coords.shape[1]),
        "chains": [
            {
                "index": chain.index,
                "chain_id": chain.chain_id,
                "entity_id": chain.entity_id,
                "entity_type": chain.entity_type,
                "residues": len(chain.residues),
                "tokens": chain.n_tokens,
                "sequence": chain.sequence,
            }
            for chain in chains
        ],
        "models": models,
    }


def _plain(value: object) -> object:
    """JSON for what engines put in provenance: numpy scalars and arrays, else the text form."""
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    return str(value)
