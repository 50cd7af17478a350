"""One real Snakemake run of the whole workflow (demo model, CI recipe, CPU), read by the tests of a finished
run (tests/test_no_data_loss.py, tests/test_run_visibility.py): every job of a run starts a Python process,
so one run shared by both costs one set of start-ups instead of one per module (conftest's `workflow_run`).

Its targets, each chosen for what a user must be told:
- proteins.fasta: two plain proteins and a record with a bad residue letter;
- targets.tsv: a sheet with a user MSA that does not match its sequence (given by one of two targets with
  that sequence), a good user MSA given by one of two targets with the same sequence, a user template
  naming a chain its file lacks, and another record with a bad residue letter.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from foldmill.msa.parse import read_msa
from foldmill.outputs.summary import read_summary
from foldmill.templates.structure import read_template
from test_fold import CI_CONFIG
from test_msa_staging import BAD_SEQUENCE

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
GOOD = {"prot1": "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "prot2": "GSHMLEDPVDAFQNLYIQWLKDGGPSSGRPPPS"}
BAD = {"bad1": "MK2LLV", "bad2": "MXJ9"}
# Besides the workflow's defaults: what the run's config sets (a rerun on a copy of it gives the same).
SETTINGS = {**CI_CONFIG, "moe": {"enabled": False}, "export": {"tar_gz": True}, "skip_bad": True,
            "msa": {"mode": "auto", "database": ""}}  # fmt: skip


@dataclass(frozen=True)
class WorkflowRun:
    root: Path
    out: Path
    inputs: list[Path]  # proteins.fasta, targets.tsv
    console: str  # Snakemake's stdout and stderr
    summary: pd.DataFrame  # summary.tsv, indexed by target_id
    hemoglobin: str  # the sequence of the targets hb_user and hb_plain


def fasta(path: Path, records: dict[str, str]) -> Path:
    path.write_text("".join(f">{name}\n{sequence}\n" for name, sequence in records.items()))
    return path


def write_config(root: Path, name: str, inputs: list[Path], outdir: Path, **extra) -> Path:
    config = {"outdir": str(outdir), "inputs": [str(p) for p in inputs], **SETTINGS, **extra}
    path = root / name
    path.write_text(yaml.safe_dump(config))
    return path


def snakemake(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [*SNAKEMAKE, "--cores", "2", "--configfile", str(config), *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, umask=0o022, timeout=900)


def target_sheet(path: Path, data_dir: Path) -> tuple[Path, str]:
    """The sheet of MSA and template cases; the hemoglobin sequence two of its targets share."""
    msas, structures = data_dir / "msas", data_dir / "structures"
    hemoglobin = read_msa(msas / "1a00_A_uniref90.a3m").query
    lysozyme = read_template(structures / "1aki.cif").chains["A"].sequence
    rows = [
        # target_id, sequence, msa, template, template_chain_ids
        ("hb_user", hemoglobin, str(msas / "1a00_A_uniref90.a3m"), "", ""),
        ("hb_plain", hemoglobin, "", "", ""),
        ("bad_user", BAD_SEQUENCE, str(msas / "seq2.a3m"), "", ""),
        ("bad_plain", BAD_SEQUENCE, "", "", ""),
        ("template_bad", lysozyme, "", str(structures / "1aki.cif"), "Z"),
        ("broken", "MK2", "", "", ""),
    ]
    header = "target_id\tentity_type\tchain_ids\tsequence\tmsa\ttemplate\ttemplate_chain_ids\n"
    path.write_text(header + "".join(f"{row[0]}\tprotein\tA\t" + "\t".join(row[1:]) + "\n" for row in rows))
    return path, hemoglobin


def run_workflow(root: Path, data_dir: Path) -> WorkflowRun:
    sheet, hemoglobin = target_sheet(root / "targets.tsv", data_dir)
    inputs = [fasta(root / "proteins.fasta", {**GOOD, "bad1": BAD["bad1"]}), sheet]
    out = root / "out"
    done = snakemake(write_config(root, "run.yaml", inputs, out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = read_summary(out / "summary.tsv").set_index("target_id")
    return WorkflowRun(root, out, inputs, done.stdout + done.stderr, summary, hemoglobin)
