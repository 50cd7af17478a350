"""MSA and template staging through the real Snakemake workflow and a real MMseqs2 search.

One workflow run stages the 94-protein yeast chromosome I proteome plus a few special targets
against a small sequence database built here from tests/data (the A3M sequences, tagged with a
TaxID per source file, and the proteome), and searches templates in a seqres FASTA built from
tests/data/structures. A second run must have nothing to do.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from foldmill.errors import FoldmillError
from foldmill.features.staged import StagedInputs
from foldmill.io.worklist import load_worklist
from foldmill.msa.parse import read_msa
from foldmill.msa.staging import MANIFEST_COLUMNS, MSAStagingConfig, read_msa_manifest, stage_msas
from foldmill.msa.types import MSA
from foldmill.templates.search import structure_files, write_seqres
from foldmill.templates.structure import read_template
from foldmill.templates.types import TemplateAlignment

pytestmark = pytest.mark.skipif(shutil.which("mmseqs") is None, reason="needs MMseqs2 (scripts/apt-packages.txt)")

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
SOURCE_TAXID = {"seq1": 900001, "seq2": 900002}
# Boltz's example sequence for seq2.a3m: 17 residues of the MSA query are missing from it.
BAD_SEQUENCE = (
    "QLEDSEVEAVAKGLEEMYANGVTEDNFKNYVKNNFAQQEISSVEEELNVNISD"
    "SCVANKIKDEFFAMISISAIVKAAQKKAWKELAVTVLRFAKANGLKTNAIIVAGQLALWAVQCG"
)


def write_search_database(data_dir: Path, path: Path) -> None:
    """A3M rows without gaps (seq1/seq2 tagged with a TaxID per file; 1a00 keeps its own) + the proteome."""
    records = []
    for name in ("seq1", "seq2", "1a00_A_uniref90"):
        header = None
        for line in (data_dir / "msas" / f"{name}.a3m").read_text().splitlines():
            if line.startswith(">"):
                header = line[1:].split("\t")[0]
                if name in SOURCE_TAXID:
                    header = f"{name}_{len(records)} {header} TaxID={SOURCE_TAXID[name]}"
            elif line and line[0] not in "#;" and header:
                records.append(f">{header}\n{re.sub('[^A-Za-z]', '', line).upper()}\n")
    path.write_text("".join(records) + (data_dir / "proteomes" / "yeast_chr1.fasta").read_text())


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path, repo: Path) -> dict:
    root = tmp_path_factory.mktemp("staging")
    write_search_database(data_dir, root / "db.fasta")
    write_seqres(structure_files(data_dir / "structures"), root / "seqres.fasta")
    seq1_query = read_msa(data_dir / "msas" / "seq1.a3m").query
    hemoglobin = read_msa(data_dir / "msas" / "1a00_A_uniref90.a3m").query
    lysozyme = read_template(data_dir / "structures" / "1aki.cif").chains["A"].sequence
    (root / "extra.fasta").write_text(f">seq1_query\n{seq1_query}\n>lysozyme_mut\n{lysozyme[:40]}W{lysozyme[41:]}\n")
    msa_dir = data_dir / "msas"
    rows = [
        ("empty_and_dna", "protein", "MKTAYIAKQRQISFVKSHFSRQ", "empty", "A"),
        ("empty_and_dna", "dna", "ACGTACGT", "", "B"),
        ("user_msa", "protein", hemoglobin, str(msa_dir / "1a00_A_uniref90.a3m"), "A"),
        ("bad_msa", "protein", BAD_SEQUENCE, str(msa_dir / "seq2.a3m"), "A"),
        # Same sequences as `bad_msa` and extra.fasta's seq1_query, one without an MSA, one with its own.
        ("bad_plain", "protein", BAD_SEQUENCE, "", "A"),
        ("seq1_user", "protein", seq1_query, str(msa_dir / "seq1.a3m"), "A"),
    ]
    sheet = "target_id\tentity_type\tsequence\tmsa\tchain_ids\n" + "".join("\t".join(r) + "\n" for r in rows)
    (root / "targets.tsv").write_text(sheet)
    (root / "config.yaml").write_text(
        f"outdir: {root / 'results'}\n"
        "model: {checkpoint: demo}\n"
        f"inputs: [{data_dir / 'proteomes' / 'yeast_chr1.fasta'}, {root / 'extra.fasta'}, {root / 'targets.tsv'}]\n"
        f"msa: {{database: {root / 'db.fasta'}, threads: 2}}\n"
        f"templates: {{seqres: {root / 'seqres.fasta'}, mmcif_dir: {data_dir / 'structures'}, threads: 2}}\n"
    )
    staged = root / "results" / "staged"
    command = [
        SNAKEMAKE, "--snakefile", str(repo / "Snakefile"), "--configfile", str(root / "config.yaml"),
        "--directory", str(root), "--cores", "2",
        str(staged / "msa_manifest.tsv"), str(staged / "templates_manifest.tsv"),
    ]  # fmt: skip
    first = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    second = subprocess.run(command, capture_output=True, text=True, timeout=600)
    return {"root": root, "staged": staged, "first": first, "second": second, "seq1_query": seq1_query}


def test_every_chain_staged_or_rejected(run: dict) -> None:
    root, staged = run["root"], run["staged"]
    chains = pd.read_csv(
        root / "results" / "worklist" / "unique_chains.tsv", sep="\t", dtype=str, keep_default_na=False
    )
    manifest = pd.read_csv(staged / "msa_manifest.tsv", sep="\t", dtype={"chain_hash": str})
    rejects = pd.read_csv(staged / "msa_rejects.tsv", sep="\t", dtype=str)
    assert list(manifest.columns) == MANIFEST_COLUMNS
    assert len(manifest) + len(rejects) == len(chains) == 94 + 2 + 2 + 1 + 1 + 2
    assert not manifest.duplicated(["chain_hash", "given_msa"]).any()
    sequences = dict(zip(chains["chain_hash"], chains["sequence"]))
    for row in manifest.itertuples():
        msa = MSA.load(row.path)
        assert msa.depth == row.depth and msa.query == sequences[row.chain_hash]
    by_source = manifest.groupby("source")["chain_hash"].count().to_dict()
    assert by_source == {"search": 97, "single_sequence": 2, "user": 2}
    assert rejects["target_ids"].tolist() == ["bad_msa"]  # not bad_plain, which has the same sequence
    assert rejects["given_msa"].iloc[0].endswith("seq2.a3m")
    assert "seq2.a3m" in rejects["source"].iloc[0] and "query" in rejects["problem"].iloc[0]


def test_user_msa_serves_only_the_target_that_gave_it(run: dict, data_dir: Path) -> None:
    """seq1_user gave seq1.a3m; seq1_query (same sequence, no MSA) gets the searched MSA, not the user's."""
    worklist = {t.target_id: t for t in load_worklist(run["root"] / "results" / "worklist" / "worklist.tsv")}
    user = StagedInputs.from_manifests(run["root"] / "results", worklist["seq1_user"])
    searched = StagedInputs.from_manifests(run["root"] / "results", worklist["seq1_query"])
    user_msa = user.msa(worklist["seq1_user"], worklist["seq1_user"].entities[0], 8192)
    searched_msa = searched.msa(worklist["seq1_query"], worklist["seq1_query"].entities[0], 8192)
    assert user_msa.depth == read_msa(data_dir / "msas" / "seq1.a3m").depth
    assert (searched_msa.keys[1:] == f"taxid:{SOURCE_TAXID['seq1']}").mean() >= 0.95  # the search's own rows
    assert not (user_msa.keys == f"taxid:{SOURCE_TAXID['seq1']}").any()
    manifest = read_msa_manifest(run["staged"] / "msa_manifest.tsv")
    seq1 = manifest[manifest["chain_hash"] == worklist["seq1_user"].entities[0].sequence_hash()]
    assert sorted(seq1["source"]) == ["search", "user"]
    bad_plain = StagedInputs.from_manifests(run["root"] / "results", worklist["bad_plain"])
    assert bad_plain.msa(worklist["bad_plain"], worklist["bad_plain"].entities[0], 8192).query == BAD_SEQUENCE


def test_one_batched_search_finds_homologs(run: dict) -> None:
    log = (run["root"] / "results" / "logs" / "stage_msas.log").read_text()
    assert len(re.findall(r"running \S*mmseqs search ", log)) == 1
    assert "searching 97 chains" in log
    # Chains whose only hit was themselves: said once, with the count.
    warning = r"msa: \d+ of 100 protein chains \(distinct sequence and MSA\) have single-sequence MSAs \(the search"
    assert len(re.findall(warning, log)) == 1
    manifest = pd.read_csv(run["staged"] / "msa_manifest.tsv", sep="\t", dtype={"chain_hash": str})
    for row in manifest[manifest["source"] == "search"].itertuples():
        msa = MSA.load(row.path)
        if msa.query == run["seq1_query"]:
            homologs = (msa.keys == f"taxid:{SOURCE_TAXID['seq1']}").sum()
            assert msa.depth > 150  # seq1.a3m holds 248 homologs; the search finds most of them
            assert homologs >= 0.95 * (msa.depth - 1)
            assert msa.deletions.sum() > 0
            break
    else:
        pytest.fail("the seq1 query was not searched")


def test_user_and_single_sequence_msas(run: dict, data_dir: Path) -> None:
    manifest = pd.read_csv(run["staged"] / "msa_manifest.tsv", sep="\t", dtype={"chain_hash": str})
    user = manifest[manifest["source"] == "user"].iloc[0]
    assert user["depth"] == read_msa(data_dir / "msas" / "1a00_A_uniref90.a3m").depth
    singles = manifest[manifest["source"] == "single_sequence"]
    assert sorted(singles["entity_type"]) == ["dna", "protein"] and (singles["depth"] == 1).all()


def test_second_run_is_a_no_op(run: dict) -> None:
    assert run["second"].returncode == 0
    assert "Nothing to be done" in run["second"].stdout + run["second"].stderr


def test_searched_templates_in_manifest(run: dict) -> None:
    manifest = pd.read_csv(run["staged"] / "templates_manifest.tsv", sep="\t", dtype=str, keep_default_na=False)
    assert list(manifest.columns)[:4] == ["target_id", "chain_id", "template_id", "path"]
    lysozyme = manifest[manifest["target_id"] == "lysozyme_mut"]
    assert lysozyme["template_id"].tolist() == ["1aki_A"]
    alignment = TemplateAlignment.load(lysozyme["path"].iloc[0])
    assert len(alignment) == 129 and alignment.release_date == "1997-11-19"
    assert set(manifest["target_id"]) == {"lysozyme_mut"}  # no yeast protein has a template here


def test_cache_reuse_and_modes(run: dict, tmp_path: Path) -> None:
    chains = run["root"] / "results" / "worklist" / "unique_chains.tsv"
    cache = run["staged"] / "cache" / "msa"
    config = MSAStagingConfig(database=str(run["root"] / "db.fasta"), cache_dir=str(cache))
    again = stage_msas(chains, tmp_path / "a" / "msa_manifest.tsv", config)
    assert again.searched == 0 and len(again.manifest) == 101
    original = pd.read_csv(run["staged"] / "msa_manifest.tsv", sep="\t", dtype={"chain_hash": str})
    assert again.manifest["path"].tolist() == original["path"].tolist()

    single = stage_msas(chains, tmp_path / "b" / "msa_manifest.tsv", MSAStagingConfig(mode="single_sequence"))
    assert single.searched == 0
    assert set(single.manifest["source"]) == {"single_sequence", "user"}

    user_only = stage_msas(chains, tmp_path / "c" / "msa_manifest.tsv", MSAStagingConfig(mode="user_only"))
    assert len(user_only.rejects) == 97 + 1
    assert "user_only" in user_only.rejects["problem"].iloc[0]

    with pytest.raises(FoldmillError, match="msa.database is not set"):
        stage_msas(chains, tmp_path / "d" / "msa_manifest.tsv", MSAStagingConfig(mode="search"))
