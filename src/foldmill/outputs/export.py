"""High-confidence export: the passing targets' structures in one folder, ready to hand on.

Layout of the export folder:
  structures/<target_id>/   top_k ranked models (mmCIF, PDB if written, confidence JSON,
                            optionally the pLDDT/PAE/PDE arrays) and the prediction record
  summary.tsv               the summary rows of the exported targets
  README.md                 thresholds used, counts, models, how to check the files
  manifest.tsv              path (relative to the folder) and sha256 of every other file
The folder is assembled beside its final place and renamed in, so it is never half-written. It
replaces only an earlier export (foldmill.io.atomic.owned_directory): a folder holding anything
else is refused before a file is written.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from foldmill import __version__
from foldmill.io.atomic import owned_directory, owned_files
from foldmill.io.hashing import file_sha256
from foldmill.outputs.filters import CRITERIA, STATUS_FILTER, TARGET_TYPES, FilterConfig, failure_counts
from foldmill.outputs.modelcif import model_label
from foldmill.outputs.summary import SUMMARY_COLUMNS
from foldmill.outputs.writer import record_name
from foldmill.provenance import DEMO_WARNING, is_demo_checkpoint

MANIFEST = "manifest.tsv"
COMMAND = "export"  # the owner named in the export folder's ledger
ARRAY_KINDS = ("plddt", "pae", "pde")


@dataclass(frozen=True)
class ExportOptions:
    top_k: int = 1  # ranked models per target (1 = the best only)
    include_arrays: bool = False  # also the pLDDT/PAE/PDE .npz files


def export_passing(
    filter_result: pd.DataFrame, export_dir: str | Path, filters: FilterConfig, options: ExportOptions
) -> int:
    """Write the export folder for the targets with passed == True; returns how many were exported."""
    passing = filter_result[filter_result["passed"].astype(bool)]
    export_dir = Path(export_dir)
    with owned_directory(export_dir, COMMAND) as staging:
        for row in passing.to_dict("records"):
            _copy_target(
                Path(row["prediction_dir"]), row["target_id"], staging / "structures" / row["target_id"], options
            )
        passing[SUMMARY_COLUMNS].to_csv(staging / "summary.tsv", sep="\t", index=False)
        (staging / "README.md").write_text(
            export_readme(filter_result, filters, options, models=sorted(set(passing["model"]))), encoding="utf-8"
        )
        write_manifest(staging)
    return len(passing)


def _copy_target(source: Path, target_id: str, destination: Path, options: ExportOptions) -> None:
    record = json.loads((source / record_name(target_id)).read_text(encoding="utf-8"))
    destination.mkdir(parents=True)
    kinds = ("structure", "pdb", "confidence", *(ARRAY_KINDS if options.include_arrays else ()))
    for model in record["models"][: options.top_k]:
        for kind in kinds:
            name = model["files"].get(kind)
            if name:
                shutil.copy2(source / name, destination / name)
    shutil.copy2(source / record_name(target_id), destination / record_name(target_id))


def write_manifest(folder: Path) -> None:
    """manifest.tsv: every file under `folder` (but itself), sorted, with its sha256."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    rows = [{"path": p.relative_to(folder).as_posix(), "sha256": file_sha256(p)} for p in files]
    pd.DataFrame(rows, columns=["path", "sha256"]).to_csv(folder / MANIFEST, sep="\t", index=False)


def export_readme(filter_result: pd.DataFrame, filters: FilterConfig, options: ExportOptions, models: list[str]) -> str:
    """The export's README: what is inside and the thresholds that selected it."""
    passed = filter_result["passed"].astype(bool)
    lines = ["# foldmill high-confidence export", ""]
    demo = int(filter_result["model"].map(is_demo_checkpoint).sum())
    if demo:
        lines += [f"> **WARNING: {demo} target(s) folded by the {DEMO_WARNING}.**", ""]
    lines += [
        f"{int(passed.sum())} of {len(filter_result)} targets passed the confidence filters (foldmill {__version__}).",
        "",
    ]
    lines += [f"**Model**: {model_label({'model': model})}" for model in models] + [""]
    lines += [
        "## Thresholds",
        "",
        "A monomer has one chain; a complex more (ligands count). A target passes when it folded and meets",
        "every threshold of its type; `-` means the threshold is not applied. Minimums and maximums are",
        "inclusive. pLDDT is on the 0-100 scale (Boltz's complex_plddt x 100); per-chain pTM is the lowest",
        "pTM of a polymer chain; interface PAE is the mean PAE (Angstrom) over inter-chain token pairs",
        "closer than 8 A.",
        "",
        "| threshold | " + " | ".join(TARGET_TYPES) + " | targets failing it |",
        "|---|" + "---|" * (len(TARGET_TYPES) + 1),
    ]
    counts = failure_counts(filter_result)
    for criterion in CRITERIA:
        values = [asdict(filters.for_type(t))[criterion.name] for t in TARGET_TYPES]
        shown = " | ".join("-" if value is None else f"{value:g}" for value in values)
        lines.append(f"| {criterion.name} ({criterion.label}) | {shown} | {counts[criterion.name]} |")
    lines += ["", f"{counts[STATUS_FILTER]} target(s) did not fold (status failed, rejected, skipped or missing)."]
    lines += [
        "",
        "## Contents",
        "",
        f"- `structures/<target_id>/`: the best {options.top_k} ranked model(s) per target: `<id>_model_<rank>.cif`",
        "  (ModelCIF, pLDDT as B-factor), `confidence_<id>_model_<rank>.json` (Boltz's fields)"
        + (", pLDDT/PAE/PDE `.npz`" if options.include_arrays else "")
        + ", and `prediction_<id>.json` (chains, ranking, interface PAE, provenance).",
        "- `summary.tsv`: the run summary rows of these targets.",
        f"- `{MANIFEST}`: path and sha256 of every file; check with",
        f"  `tail -n +2 {MANIFEST} | awk -F'\\t' '{{print $2\"  \"$1}}' | sha256sum -c`.",
        "",
    ]
    return "\n".join(lines)


def archive_export(export_dir: str | Path, archive: str | Path) -> None:
    """export.tar.gz of the export folder (member names start with 'export/'), written atomically.

    It may sit beside other files (a run's outdir) but replaces only an archive written by export.
    """
    export_dir = Path(export_dir)
    with owned_files([archive], COMMAND, exclusive=False) as (temporary,):
        with tarfile.open(temporary, "w:gz") as tar:
            tar.add(export_dir, arcname="export", filter=_portable)


def _portable(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """No local user names in a file meant to be shared; no hidden files (the ownership ledger)."""
    if Path(member.name).name.startswith("."):
        return None
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    return member
