"""MSA parsing on the real MSAs in tests/data/msas, checked against a tiny reference parser
written here, against OSS Boltz's A3M parser (its parsing is right; its featurizer loses the
deletions), and on hand-written A3M / Boltz CSV / Stockholm files."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from foldmill.errors import InputError
from foldmill.features import featurize
from foldmill.features.msa_features import token_ids
from foldmill.features.staged import StagedInputs
from foldmill.io.targets import Entity, Target
from foldmill.msa.parse import RawRow, read_msa, rows_to_msa
from foldmill.msa.types import MSA
from foldmill.vocab import NUM_TOKENS, TOKENS

THREE = dict(
    zip(
        "ARNDCQEGHILKMFPSTWYV",
        "ALA ARG ASN ASP CYS GLN GLU GLY HIS ILE LEU LYS MET PHE PRO SER THR TRP TYR VAL".split(),
    )
)
MSA_FILES = ["seq1.a3m", "seq2.a3m", "1a00_A_uniref90.a3m"]


def reference_parse(path: Path) -> list[tuple[str, list[int]]]:
    """Rows of an A3M as (aligned columns, insertions before each column), first copy of each sequence."""
    records: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith(">"):
            records.append("")
        elif line and line[0] not in "#;" and records:
            records[-1] += line.strip()
    rows, seen = [], set()
    for text in records:
        ungapped = text.replace("-", "").upper()
        if ungapped in seen:
            continue
        seen.add(ungapped)
        columns, insertions, pending = "", [], 0
        for char in text:
            if char.islower():
                pending += 1
            else:
                columns += char
                insertions.append(pending)
                pending = 0
        rows.append((columns, insertions))
    return rows


@pytest.mark.parametrize("name", MSA_FILES)
def test_depth_residues_deletions_and_profile_match_a_reference_parser(data_dir: Path, name: str) -> None:
    path = data_dir / "msas" / name
    expected = reference_parse(path)
    msa = read_msa(path)
    assert msa.depth == len(expected)
    assert [row.tobytes().decode() for row in msa.residues] == [columns for columns, _ in expected]
    assert msa.deletions.tolist() == [insertions for _, insertions in expected]
    assert msa.deletions.sum() > 0

    # The features the model consumes, through the production featurizer.
    target = Target("t", (Entity("protein", ("A",), sequence=msa.query, msa=str(path)),))
    features = featurize(target, StagedInputs.from_target(target)).features
    counts = [[0] * NUM_TOKENS for _ in range(msa.length)]
    for columns, _ in expected:
        for j, char in enumerate(columns):
            counts[j][TOKENS.index("-" if char == "-" else THREE.get(char, "UNK"))] += 1
    reference_profile = np.array(counts, dtype=np.float64) / len(expected)
    np.testing.assert_allclose(features["profile"][0].numpy(), reference_profile, atol=1e-6)

    reference_mean = [
        sum(math.pi / 2 * math.atan(ins[j] / 3) for _, ins in expected) / len(expected) for j in range(msa.length)
    ]
    np.testing.assert_allclose(features["deletion_mean"][0].numpy(), reference_mean, rtol=1e-5, atol=1e-6)
    assert features["has_deletion"][0].sum() == sum(1 for _, ins in expected for d in ins if d)


def test_explicit_rows_of_seq1(data_dir: Path) -> None:
    msa = read_msa(data_dir / "msas" / "seq1.a3m")
    lines = [line for line in (data_dir / "msas" / "seq1.a3m").read_text().splitlines() if not line.startswith(">")]
    # seq1.a3m has one line per record and no repeated sequence, so file rows are MSA rows.
    assert msa.depth == len(lines)
    row = next(i for i, line in enumerate(lines) if re.search("[a-z]", line))
    line = lines[row]
    first_lower = re.search("[a-z]+", line)
    column = len(re.sub("[a-z]", "", line[: first_lower.start()]))
    assert msa.deletions[row, column] == len(first_lower.group(0))
    assert msa.keys[0] == "" and msa.keys[1] == "uniref:UniRef100_A0A0D4WTP2"


def test_agrees_with_boltz_a3m_parser(data_dir: Path) -> None:
    from boltz.data import const
    from boltz.data.parse.a3m import parse_a3m

    path = data_dir / "msas" / "seq1.a3m"
    oracle = parse_a3m(path, None)
    msa = read_msa(path)
    ids = token_ids(msa.residues, "protein")
    assert len(oracle.sequences) == msa.depth
    for i, sequence in enumerate(oracle.sequences):
        residues = oracle.residues[sequence["res_start"] : sequence["res_end"]]["res_type"]
        np.testing.assert_array_equal(residues, ids[i])
        deletions = np.zeros(msa.length, dtype=np.int64)
        for entry in oracle.deletions[sequence["del_start"] : sequence["del_end"]]:
            deletions[entry["res_idx"]] = entry["deletion"]
        np.testing.assert_array_equal(deletions, msa.deletions[i])
    assert const.token_ids["-"] == TOKENS.index("-")


def test_taxonomy_keys_from_uniref90_headers(data_dir: Path) -> None:
    msa = read_msa(data_dir / "msas" / "1a00_A_uniref90.a3m")
    assert msa.keys[1] == "taxid:40151"  # "... Tax=Monodon monoceros TaxID=40151 ..."
    assert (msa.keys[1:] != "").all()


def test_depth_cap_keeps_file_order(data_dir: Path) -> None:
    full = read_msa(data_dir / "msas" / "1a00_A_uniref90.a3m")
    capped = read_msa(data_dir / "msas" / "1a00_A_uniref90.a3m", max_depth=100)
    assert capped.depth == 100
    np.testing.assert_array_equal(capped.residues, full.residues[:100])


def test_save_load_round_trip(tmp_path: Path, data_dir: Path) -> None:
    msa = read_msa(data_dir / "msas" / "seq2.a3m")
    msa.save(tmp_path / "m.npz")
    back = MSA.load(tmp_path / "m.npz")
    np.testing.assert_array_equal(back.residues, msa.residues)
    np.testing.assert_array_equal(back.deletions, msa.deletions)
    np.testing.assert_array_equal(back.keys, msa.keys)
    assert MSA.read_depth(tmp_path / "m.npz") == msa.depth


def test_boltz_csv_keeps_keyed_repeats_and_reads_insertions(tmp_path: Path) -> None:
    path = tmp_path / "chain.csv"
    path.write_text("key,sequence\n,ACDEF\n7,AC-EF\n7,AC-EF\n,ACaaDEF\n,ACaaDEF\n9,-CDEFg\n")
    msa = read_msa(path, "ACDEF")
    assert msa.keys.tolist() == ["", "7", "7", "", "9"]
    assert msa.residues[3].tobytes() == b"ACDEF"
    assert msa.deletions[3].tolist() == [0, 0, 2, 0, 0]
    assert msa.deletions[4].tolist() == [0, 0, 0, 0, 0]  # a trailing insertion has no column


def test_stockholm_insert_columns_become_deletions(tmp_path: Path) -> None:
    path = tmp_path / "chain.sto"
    path.write_text(
        "# STOCKHOLM 1.0\n#=GS hit1 DE Some protein OX=9606\nquery  AC..DEF\nhit1   ACgkDE-\nhit2   -C.-DEF\n//\n"
    )
    msa = read_msa(path, "ACDEF")
    assert [r.tobytes() for r in msa.residues] == [b"ACDEF", b"ACDE-", b"-CDEF"]
    assert msa.deletions[1].tolist() == [0, 0, 2, 0, 0]
    assert msa.deletions[2].tolist() == [0, 0, 0, 0, 0]
    assert msa.keys.tolist() == ["", "taxid:9606", ""]


def test_query_mismatch_is_one_line_naming_the_file(data_dir: Path) -> None:
    # Boltz's own example pairs seq2.a3m with a sequence missing 17 of its residues.
    sequence = (
        "QLEDSEVEAVAKGLEEMYANGVTEDNFKNYVKNNFAQQEISSVEEELNVNISD"
        "SCVANKIKDEFFAMISISAIVKAAQKKAWKELAVTVLRFAKANGLKTNAIIVAGQLALWAVQCG"
    )
    with pytest.raises(InputError) as error:
        read_msa(data_dir / "msas" / "seq2.a3m", sequence)
    message = str(error.value)
    assert "seq2.a3m" in message and "query" in message and "\n" not in message


def test_construct_sequence_is_cropped_with_unknown_residues_matching(data_dir: Path) -> None:
    full = read_msa(data_dir / "msas" / "seq2.a3m")
    query = full.query
    # The chain is residues 3-60 of the MSA query; the MSA has X where the chain has M.
    sequence = query[2:60].replace("X", "M")
    msa = read_msa(data_dir / "msas" / "seq2.a3m", sequence)
    assert msa.length == 58 and msa.query == sequence
    assert msa.residues[1:].tobytes() != b""
    assert ((msa.residues[1:] != ord("-")).any(axis=1)).all()  # rows left all gaps are dropped
    assert msa.depth <= full.depth


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (">q\nACDEF\n>h\nACD\n", "line 3: row has 3 aligned columns but the query has 5"),
        (">q\nACDEF\n>h\nAC1EF\n", "line 3: invalid character '1'"),
        ("ACDEF\n", "line 1: sequence before the first '>' header"),
    ],
)
def test_bad_a3m_rows_name_file_and_line(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.a3m"
    path.write_text(text)
    with pytest.raises(InputError) as error:
        read_msa(path)
    assert str(error.value).startswith(str(path)) and fragment in str(error.value)


def test_bad_csv_columns_and_unknown_format(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("id,seq\nx,ACD\n")
    with pytest.raises(InputError, match="bad.csv: header: expected the columns key,sequence"):
        read_msa(path)
    other = tmp_path / "msa.txt"
    other.write_text(">q\nACD\n")
    with pytest.raises(InputError, match="unknown MSA format"):
        read_msa(other)


def test_nucleotide_letters_map_per_polymer_type() -> None:
    residues = np.frombuffer(b"ACGU-N", dtype=np.uint8)[None, :]
    rna = token_ids(residues, "rna")[0]
    assert [TOKENS[i] for i in rna] == ["A", "C", "G", "U", "-", "N"]
    dna = token_ids(np.frombuffer(b"ACGT", dtype=np.uint8)[None, :], "dna")[0]
    assert [TOKENS[i] for i in dna] == ["DA", "DC", "DG", "DT"]


def test_cli_reports_a_bad_msa_in_one_line(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from foldmill.cli import main

    assert main(["msa", "show", str(data_dir / "msas" / "seq1.a3m")]) == 0
    assert "depth 249, length 384" in capsys.readouterr().out
    assert main(["msa", "show", str(data_dir / "msas" / "seq1.a3m"), "--sequence", "MKTAYIAK"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("foldmill: error: ") and "seq1.a3m" in error and "\n" not in error


def test_search_hit_becomes_an_a3m_row() -> None:
    from foldmill.msa.mmseqs import Hit

    # query positions 3-9 (1-based) of a 12-residue query; the hit has an insertion (KR) and a deletion
    hit = Hit("q", "t", 1e-5, 50.0, 3, 9, 10, 17, "DEF--GHIK", "DEFKRG-IK", "t some protein TaxID=9")
    row = hit.a3m_row(12)
    assert row == "--DEFkrG-IK---"
    msa = rows_to_msa(iter([RawRow("ACDEFGHIKLMN", "", "query"), RawRow(row, "taxid:9", "hit")]), "search")
    assert msa.residues[1].tobytes() == b"--DEFG-IK---"
    assert msa.deletions[1].tolist() == [0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0]
