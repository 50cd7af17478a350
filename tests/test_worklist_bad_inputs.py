"""Bad inputs: one clear line naming file, record and problem; --skip-bad collects them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from foldmill.errors import InputError
from foldmill.io.worklist import build_worklist

GOOD_FASTA = ">good1 a protein\nMKTAYIAKQR\n"


# (case id, file name, content, record expected in the message, problem fragment)
BAD_INPUTS = [
    ("unknown residue", "p.fasta", ">p1\nMKT1AYK\n", "line 1 (p1)", "unknown residue letter(s) '1' (first at position 4)"),
    ("stop codon inside", "p.fasta", ">p1\nMKT*AYK\n", "line 1 (p1)", "unknown residue letter(s) '*'"),
    ("empty sequence", "p.fasta", ">p1\n>p2\nMKT\n", "line 1 (p1)", "empty sequence"),
    ("duplicate id", "p.fasta", ">p1\nMKT\n>p1\nMKV\n", "line 3 (p1)", "duplicate target id 'p1'"),
    ("path separator", "p.fasta", ">../etc/passwd\nMKT\n", "line 1", "is not a safe file name"),
    ("dot dot", "p.fasta", ">a..b\nMKT\n", "line 1", "is not a safe file name"),
    ("data before header", "p.fasta", "MKT\n>p1\nMKT\n", "line 1", "sequence data before the first '>' header"),
    ("no records", "p.fasta", "\n\n", None, "no FASTA records found"),
    ("malformed yaml", "t.yaml", "sequences:\n  - protein: {id: A, sequence: MKT\n", "line", "malformed YAML"),
    ("missing msa", "t.yaml", "sequences:\n  - protein:\n      id: A\n      sequence: MKT\n      msa: nowhere.a3m\n", "file", "MSA file"),
    ("unknown ccd", "t.yaml", "sequences:\n  - ligand:\n      id: B\n      ccd: QQQQQ\n", "file", "unknown CCD code 'QQQQQ'"),
    ("ccd and smiles", "t.yaml", "sequences:\n  - ligand:\n      id: B\n      ccd: ATP\n      smiles: CCO\n", "file", "exactly one of 'ccd' or 'smiles'"),
    ("bad smiles", "t.yaml", "sequences:\n  - ligand:\n      id: B\n      smiles: 'C[C@H'\n", "file", "invalid SMILES"),
    ("unknown key", "t.yaml", "sequences:\n  - protein:\n      id: A\n      sequense: MKT\n", "sequences[1]", "unknown key(s) sequense"),
    ("unknown entity", "t.yaml", "sequences:\n  - peptide:\n      id: A\n      sequence: MKT\n", "sequences[1]", "unknown entity type 'peptide'"),
    ("duplicate chain", "t.yaml", "sequences:\n  - protein:\n      id: [A, A]\n      sequence: MKT\n", "file", "chain id 'A' is used twice"),
    ("dna with U", "t.yaml", "sequences:\n  - dna:\n      id: A\n      sequence: ACGU\n", "file", "unknown residue letter(s) 'U'"),
    ("bad version", "t.yaml", "version: 2\nsequences:\n  - protein: {id: A, sequence: MKT}\n", "version", "unsupported Boltz YAML version 2"),
    ("modification outside", "t.yaml", "sequences:\n  - protein:\n      id: A\n      sequence: MKT\n      modifications: [{position: 9, ccd: SEP}]\n", "file", "modification at position 9 is outside chain A"),
    ("missing template", "t.yaml", "sequences:\n  - protein: {id: A, sequence: MKT}\ntemplates:\n  - cif: missing.cif\n    chain_id: A\n", "file", "template file"),
    ("sheet missing column", "s.tsv", "target_id\tsequence\nt1\tMKT\n", "header", "missing column(s) entity_type"),
    ("sheet bad copies", "s.tsv", "target_id\tentity_type\tsequence\tcopies\nt1\tprotein\tMKT\ttwo\n", "line 2 (t1)", "copies must be a positive integer"),
    ("sheet unknown type", "s.tsv", "target_id\tentity_type\tsequence\nt1\tlipid\tMKT\n", "line 2 (t1)", "unknown entity type 'lipid'"),
    ("sheet long chain id", "s.tsv", "target_id\tentity_type\tsequence\tchain_ids\nt1\tprotein\tMKT\tABCDE\n", "line 2 (t1)", "chain id 'ABCDE' must be 1-4 letters or digits"),
    ("unknown file type", "t.txt", "MKT\n", None, "unknown input type"),
]


@pytest.mark.parametrize(("case", "name", "content", "record", "problem"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_message(tmp_path: Path, case: str, name: str, content: str, record: str | None, problem: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(InputError) as caught:
        build_worklist([path])
    message = str(caught.value)
    assert message.startswith(str(path)), message
    assert problem in message, message
    if record:
        assert record in message, message
    assert "\n" not in message


def test_cli_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.fasta"
    path.write_text(">x/y\nMKT\n")
    done = subprocess.run(
        [sys.executable, "-m", "foldmill", "worklist", str(path), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"foldmill: error: {path}: line 1 (x/y): target id")
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out/worklist.tsv").exists()


def test_skip_bad_collects_rejects(tmp_path: Path) -> None:
    fasta = tmp_path / "mixed.fasta"
    fasta.write_text(GOOD_FASTA + ">bad1\nMK7\n>good2\nGGSG\n>bad/2\nMKT\n>good1\nMKV\n")
    sheet = tmp_path / "sheet.tsv"
    sheet.write_text("target_id\tentity_type\tsequence\tccd\nc1\tprotein\tMKT\t\nc1\tligand\t\tXXXXX\nc2\tdna\tACGT\t\n")
    done = subprocess.run(
        [sys.executable, "-m", "foldmill", "worklist", str(fasta), str(sheet), "-o", str(tmp_path / "out"), "--skip-bad"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "3 targets (18 tokens), 4 rejected" in done.stdout
    worklist = pd.read_csv(tmp_path / "out/worklist.tsv", sep="\t")
    assert list(worklist["target_id"]) == ["good1", "good2", "c2"]
    rejects = pd.read_csv(tmp_path / "out/rejects.tsv", sep="\t")
    problems = list(rejects["problem"])
    assert len(problems) == 4
    assert "unknown residue letter(s) '7'" in problems[0]
    assert "not a safe file name" in problems[1]
    assert "duplicate target id 'good1'" in problems[2]
    assert "unknown CCD code 'XXXXX'" in problems[3]
    assert set(rejects["source"]) == {str(fasta), str(sheet)}
