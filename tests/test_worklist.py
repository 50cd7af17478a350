"""Worklists from every accepted input kind, checked against hand-computed values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from foldmill.io.targets import Target
from foldmill.io.worklist import build_worklist, load_worklist, write_worklist

YEAST_RESIDUES = 46_974  # data/README.md: 94 proteins, 26 to 1,537 residues
SAH_HEAVY_ATOMS = 26  # S-adenosyl-L-homocysteine C14 H20 N6 O5 S: 14 + 6 + 5 + 1
TYROSINE_HEAVY_ATOMS = 13  # C9 H11 N O3: 9 + 1 + 3
EKY_HEAVY_ATOMS = 27  # CCD EKY: C21 H19 F2 N O3: 21 + 2 + 1 + 3


def _fasta_lengths(path: Path) -> dict[str, int]:
    """Independent FASTA reader for the test: first header word -> sequence length."""
    lengths: dict[str, int] = {}
    name = ""
    for line in path.read_text().splitlines():
        if line.startswith(">"):
            name = line[1:].split()[0]
            lengths[name] = 0
        else:
            lengths[name] += len(line.strip())
    return lengths


def test_yeast_proteome(data_dir: Path, tmp_path: Path) -> None:
    fasta = data_dir / "proteomes/yeast_chr1.fasta"
    result = build_worklist([fasta])
    table = result.table
    expected = _fasta_lengths(fasta)
    assert len(table) == 94
    assert table["n_tokens"].sum() == YEAST_RESIDUES
    assert dict(zip(table["target_id"], table["n_tokens"])) == expected
    assert set(table["composition"]) == {"protein:1"}
    assert table["n_tokens"].min() == 26 and table["n_tokens"].max() == 1537
    assert table["content_hash"].is_unique

    write_worklist(result, tmp_path, write_rejects=False)
    from_tsv = pd.read_csv(tmp_path / "worklist.tsv", sep="\t")
    from_parquet = pd.read_parquet(tmp_path / "worklist.parquet")
    assert list(from_tsv["target_id"]) == list(from_parquet["target_id"]) == list(table["target_id"])
    rebuilt = load_worklist(tmp_path / "worklist.parquet")
    assert rebuilt == result.targets


@pytest.mark.parametrize(
    ("name", "tokens", "composition", "n_entities"),
    [
        ("prot.yaml", 117, "protein:1", 1),
        ("prot_custom_msa.yaml", 117, "protein:1", 1),
        ("prot_no_msa.yaml", 117, "protein:1", 1),
        ("cyclic_prot.yaml", 13, "protein:1", 1),
        ("multimer.yaml", 112 + 116, "protein:2", 2),
        ("ligand.yaml", 2 * 384 + 2 * SAH_HEAVY_ATOMS + 2 * TYROSINE_HEAVY_ATOMS, "protein:2,ligand:4", 3),
        ("pocket.yaml", 937 + EKY_HEAVY_ATOMS, "protein:1,ligand:1", 2),
        ("affinity.yaml", 384 + TYROSINE_HEAVY_ATOMS, "protein:1,ligand:1", 2),
        ("prot.fasta", 117, "protein:1", 1),
        ("ligand.fasta", 2 * 384 + 2 * SAH_HEAVY_ATOMS + 2 * TYROSINE_HEAVY_ATOMS, "protein:2,ligand:4", 6),
    ],
)
def test_boltz_examples(data_dir: Path, name: str, tokens: int, composition: str, n_entities: int) -> None:
    result = build_worklist([data_dir / "boltz_inputs" / name])
    row = result.table.iloc[0]
    assert len(result.table) == 1
    assert row["target_id"] == Path(name).stem
    assert row["n_tokens"] == tokens
    assert row["composition"] == composition
    assert row["n_entities"] == n_entities


def test_boltz_yaml_details(data_dir: Path) -> None:
    ligand = build_worklist([data_dir / "boltz_inputs/ligand.yaml"]).targets[0]
    protein, sah, tyrosine = ligand.entities
    assert protein.chain_ids == ("A", "B") and protein.msa is not None and Path(protein.msa).name == "seq1.a3m"
    assert (sah.ccd, sah.chain_ids) == ("SAH", ("C", "D"))
    assert tyrosine.smiles == "N[C@@H](Cc1ccc(O)cc1)C(=O)O"
    cyclic = build_worklist([data_dir / "boltz_inputs/cyclic_prot.yaml"]).targets[0]
    assert cyclic.entities[0].cyclic
    assert build_worklist([data_dir / "boltz_inputs/prot_no_msa.yaml"]).targets[0].entities[0].msa == "empty"
    pocket = build_worklist([data_dir / "boltz_inputs/pocket.yaml"]).targets[0]
    assert pocket.constraints == ({"pocket": {"binder": "B1", "contacts": [["A1", 829], ["A1", 138]]}},)


def test_identical_chains_share_one_msa(data_dir: Path, tmp_path: Path) -> None:
    sheet = tmp_path / "sheet.tsv"
    sheet.write_text(
        "target_id\tentity_type\tsequence\tccd\tcopies\n"
        "homodimer\tprotein\tMKTAYIAK\t\t2\n"
        "hetero\tprotein\tMKTAYIAK\t\t1\n"
        "hetero\tprotein\tGGSGGS\t\t1\n"
        "hetero\tligand\t\tATP\t1\n"
    )
    result = build_worklist([sheet])
    write_worklist(result, tmp_path / "out", write_rejects=False)
    chains = pd.read_csv(tmp_path / "out/unique_chains.tsv", sep="\t")
    assert sorted(chains["sequence"]) == ["GGSGGS", "MKTAYIAK"]
    assert dict(zip(chains["sequence"], chains["n_chains"])) == {"MKTAYIAK": 3, "GGSGGS": 1}
    homodimer, hetero = result.table.itertuples()
    first, second = homodimer.chain_hashes.split(",")
    assert first == second == hetero.chain_hashes.split(",")[0]
    assert homodimer.n_tokens == 16 and homodimer.composition == "protein:2"
    # ATP: C10 H16 N5 O13 P3 -> 10 + 5 + 13 + 3 = 31 heavy atoms
    assert hetero.n_tokens == 8 + 6 + 31 and hetero.composition == "protein:2,ligand:1"
    assert Target.from_json(hetero.spec).entities[1].chain_ids == ("B",)


def test_content_hash_tracks_msa_content(data_dir: Path, tmp_path: Path) -> None:
    msa = tmp_path / "q.a3m"
    msa.write_text(">q\nMKTAYIAK\n")
    sheet = tmp_path / "s.csv"
    sheet.write_text(f"target_id,entity_type,sequence,msa\nt1,protein,MKTAYIAK,{msa}\n")
    before = build_worklist([sheet]).table["content_hash"][0]
    moved = tmp_path / "moved.a3m"
    moved.write_text(msa.read_text())
    sheet.write_text(f"target_id,entity_type,sequence,msa\nt1,protein,MKTAYIAK,{moved}\n")
    assert build_worklist([sheet]).table["content_hash"][0] == before
    moved.write_text(">q\nMKTAYIAK\n>hit\nMKTAYIAR\n")
    assert build_worklist([sheet]).table["content_hash"][0] != before


def test_modified_residue_tokens(tmp_path: Path) -> None:
    spec = tmp_path / "mod.yaml"
    spec.write_text(
        "sequences:\n  - protein:\n      id: A\n      sequence: MKSAYIAK\n"
        "      modifications:\n        - position: 3\n          ccd: SEP\n"
    )
    # SEP (phosphoserine) C3 H8 N O6 P: 3 + 1 + 6 + 1 = 11 heavy atoms, tokenized per atom.
    assert build_worklist([spec]).table["n_tokens"][0] == 7 + 11


def test_cli_writes_worklist(data_dir: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "foldmill", "worklist", str(data_dir / "boltz_inputs/multimer.yaml"), "-o", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "1 targets (228 tokens)" in done.stdout
    spec = json.loads(pd.read_csv(tmp_path / "worklist.tsv", sep="\t")["spec"][0])
    assert [e["chain_ids"] for e in spec["entities"]] == [["A"], ["B"]]
