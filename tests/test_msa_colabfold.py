"""ColabFold's search protocol: foldmill's A3Ms equal ColabFold's own, row for row.

The oracle is the `colabfold` package's `colabfold.mmseqs.search` entry point (colabfold_search),
installed by scripts/setup.sh beside the virtualenv (its pins on pandas and Biopython clash with
foldmill's, so it runs in a subprocess from its own folder). Both sides search the same small
ColabFold-format database, built from the real UniRef sequences of tests/data/msas the way
ColabFold's setup_databases.sh builds UniRef30 (tests/colabfold_db.py), with the same MMseqs2.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from foldmill.errors import FoldmillError
from foldmill.msa import colabfold
from foldmill.msa.mmseqs import mmseqs_binary
from foldmill.msa.parse import a3m_text_rows
from foldmill.msa.staging import MSAStagingConfig, stage_msas

REPO = Path(__file__).resolve().parents[1]
MSAS = REPO / "tests" / "data" / "msas"
ORACLE = Path(os.environ.get("FOLDMILL_COLABFOLD_ORACLE", REPO / ".venv" / "colabfold-oracle"))
# Human hemoglobin beta: with alpha (the query of 1a00_A_uniref90.a3m) a heterodimer whose chains
# have hits in the same species of the database.
HEMOGLOBIN_BETA = (
    "VHLTPEEKSAVTALWGKVNVDEVGGEALGRLLVVYPWTQRFFESFGDLSTPDAVMGNPKVKAHGKKVLGAFSDGLAHLDNLKGTFATLSELHCDKLHVDPENFRLL"
    "GNVLVCVLAHHFGKEFTPPVQAAYQKVVAGVANALAHKYH"
)
YEAST_PEPTIDE = "MSTTASTPSSLRHLISIKDLSDEEFRILVQRAQHFKNVFKANKTN"  # no homolog in the database

needs_oracle = pytest.mark.skipif(
    not (ORACLE / "colabfold").is_dir(), reason=f"ColabFold's package is not installed in {ORACLE} (scripts/setup.sh)"
)


def query_of(a3m: Path) -> str:
    lines = a3m.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(">"))
    return lines[first + 1].strip()


def colabfold_search(fasta: Path, database: colabfold.ColabFoldDatabases, out: Path) -> None:
    """ColabFold's own search, run as `colabfold_search` runs it (defaults but for databases and threads)."""
    arguments = [
        str(fasta), str(database.root), str(out), "--db1", database.uniref, "--db3", database.environmental,
        "--mmseqs", mmseqs_binary(), "--threads", "2",
    ]  # fmt: skip
    code = f"import sys; sys.argv = ['colabfold_search'] + {arguments!r}; "
    code += "from colabfold.mmseqs.search import main; main()"
    environment = {**os.environ, "PYTHONPATH": str(ORACLE)}
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, env=environment)


@needs_oracle
def test_unpaired_msas_equal_colabfold_search(database, tmp_path):
    queries = {
        "hba": query_of(MSAS / "1a00_A_uniref90.a3m"),
        "seq1": query_of(MSAS / "seq1.a3m"),
        "seq2": query_of(MSAS / "seq2.a3m"),
        "nohit": YEAST_PEPTIDE,
    }
    fasta = tmp_path / "queries.fasta"
    fasta.write_text("".join(f">{name}\n{sequence}\n" for name, sequence in queries.items()))
    colabfold_search(fasta, database, tmp_path / "colabfold")

    settings = colabfold.ColabFoldSettings(threads=2)
    ours, paired = colabfold.search(queries, {}, database, tmp_path / "foldmill", settings)

    assert paired == {}
    for name in queries:
        theirs = (tmp_path / "colabfold" / f"{name}.a3m").read_text()
        assert ours[name] == theirs, name
    assert ours["hba"].count(">") > 1000  # UniRef30 and environmental rows, not just the query
    assert ours["nohit"].count(">") == 2  # the query row of each database's A3M
    # equal through the skipped work: the environmental search dropped the converged no-hit query
    # (key 3) after its first iteration and kept searching for the others
    if colabfold.explicit_steps_known(mmseqs_binary()):
        assert colabfold.database_keys(tmp_path / "foldmill" / "unpaired" / "tmp3" / "active_1") == [0, 1, 2]


@needs_oracle
def test_heterodimer_paired_msa_equals_colabfold_search(database, tmp_path):
    alpha = query_of(MSAS / "1a00_A_uniref90.a3m")
    fasta = tmp_path / "dimer.fasta"
    fasta.write_text(f">hemoglobin\n{alpha}:{HEMOGLOBIN_BETA}\n")
    colabfold_search(fasta, database, tmp_path / "colabfold")

    sequences = {"alpha": alpha, "beta": HEMOGLOBIN_BETA}
    unpaired, paired = colabfold.search(
        sequences, {"hemoglobin": [alpha, HEMOGLOBIN_BETA]}, database, tmp_path / "foldmill",
        colabfold.ColabFoldSettings(threads=2),
    )  # fmt: skip

    # ColabFold writes a complex as one A3M (paired rows, then each chain's unpaired rows padded);
    # its own msa_to_str builds that file from per-chain A3Ms, so ours go through it too. Query
    # rows are named by chain position within the complex there (>101, >102).
    unpaired_chains = [unpaired["alpha"], unpaired["beta"].replace(">101\n", ">102\n")]
    chains = {"unpaired": unpaired_chains, "paired": paired["hemoglobin"], "seqs": [alpha, HEMOGLOBIN_BETA]}
    payload = json.dumps(chains)
    code = (
        "import json, sys; from colabfold.input import msa_to_str; d = json.loads(sys.stdin.read()); "
        "sys.stdout.write(msa_to_str(d['unpaired'], d['paired'], d['seqs'], [1, 1]))"
    )
    ours = subprocess.run(
        [sys.executable, "-c", code], input=payload, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(ORACLE)},
    ).stdout  # fmt: skip
    theirs = (tmp_path / "colabfold" / "hemoglobin.a3m").read_text()
    assert ours == theirs
    paired_rows = [paired["hemoglobin"][chain].count(">") for chain in range(2)]
    assert paired_rows[0] == paired_rows[1] > 100  # row i of both chains: one species


def test_database_problems_are_one_line_errors(database, tmp_path):
    with pytest.raises(FoldmillError, match="ColabFold database directory does not exist"):
        colabfold.ColabFoldDatabases.find(tmp_path / "absent")
    with pytest.raises(FoldmillError, match=r"no UniRef30 database \(uniref30_\*_db\) found"):
        colabfold.ColabFoldDatabases.find(tmp_path)

    half = tmp_path / "half"
    shutil.copytree(database.root, half, ignore=shutil.ignore_patterns(f"{database.uniref}_aln*"))
    with pytest.raises(FoldmillError) as error:
        colabfold.ColabFoldDatabases.find(half)
    assert f"{database.uniref}_aln: missing or half-built ColabFold database part" in str(error.value)
    assert "\n" not in str(error.value)

    wrong = tmp_path / "wrong"
    shutil.copytree(database.root, wrong)
    shutil.copy(wrong / f"{database.uniref}_aln.dbtype", wrong / f"{database.uniref}_seq.dbtype")
    with pytest.raises(FoldmillError, match=r"_seq: wrong database type 5 \(a ColabFold database has 0 here\)"):
        colabfold.ColabFoldDatabases.find(wrong)

    unmapped = tmp_path / "unmapped"
    shutil.copytree(database.root, unmapped, ignore=shutil.ignore_patterns("*_mapping"))
    databases = colabfold.ColabFoldDatabases.find(unmapped)
    with pytest.raises(FoldmillError, match="_mapping: missing: pairing complexes needs UniRef30's taxonomy"):
        colabfold.paired_msas([["MKV" * 10, "GSA" * 10]], databases, tmp_path / "work", colabfold.ColabFoldSettings())


def test_an_index_is_read_where_setup_built_one(database, tmp_path):
    assert database.sequences(database.uniref) == database.path(database.uniref, "_seq")
    assert database.alignments(database.uniref) == database.path(database.uniref, "_aln")
    indexed = tmp_path / "indexed"
    shutil.copytree(database.root, indexed)
    (indexed / f"{database.uniref}.idx.dbtype").write_bytes(b"\x09\x00\x00\x00")  # what createindex writes
    databases = colabfold.ColabFoldDatabases.find(indexed)
    assert databases.sequences(databases.uniref) == indexed / f"{database.uniref}.idx"
    assert databases.alignments(databases.uniref) == indexed / f"{database.uniref}.idx"
    assert databases.sequences(databases.environmental) == indexed / f"{database.environmental}_seq"


def test_a_colabfold_directory_is_recognised(database, tmp_path):
    assert colabfold.is_colabfold_directory(database.root)
    assert not colabfold.is_colabfold_directory(tmp_path)
    assert not colabfold.is_colabfold_directory(MSAS / "seq1.a3m")


def test_staging_searches_a_colabfold_directory_by_its_protocol(database, tmp_path):
    alpha = query_of(MSAS / "1a00_A_uniref90.a3m")
    chains = tmp_path / "unique_chains.tsv"
    chains.write_text(
        "chain_hash\tentity_type\tmsa\tsequence\n"
        f"{'a' * 64}\tprotein\t\t{alpha}\n"
        f"{'b' * 64}\tprotein\t\t{YEAST_PEPTIDE}\n"
    )
    config = MSAStagingConfig.from_config({"mode": "search", "database": str(database.root), "threads": 2})
    assert config.resolved_protocol() == "colabfold"
    result = stage_msas(chains, tmp_path / "staged" / "msa_manifest.tsv", config)

    a3ms, _ = colabfold.search({"alpha": alpha}, {}, database, tmp_path / "direct", config.colabfold)
    sequences = [row.text.replace("-", "").upper() for row in a3m_text_rows(a3ms["alpha"].splitlines(), "direct")]
    depths = dict(zip(result.manifest["chain_hash"], result.manifest["depth"]))
    assert depths["a" * 64] == len(dict.fromkeys(s for s in sequences)) > 1000  # distinct rows, query first
    assert depths["b" * 64] == 1  # no hit: the query alone
    assert set(result.manifest["source"]) == {"search"} and set(result.manifest["protocol"]) == {"colabfold"}
    # the first search of these databases builds no index (it would cost what it saves)
    cache = tmp_path / "staged" / "cache" / "msa"
    assert not list(cache.glob("colabfold-index/*/*.idx"))

    again = stage_msas(chains, tmp_path / "staged" / "msa_manifest.tsv", config)
    assert again.searched == 0  # cached by sequence, database and protocol settings

    # a later search of the same databases builds the index once under the cache and reads it
    chains.write_text(f"chain_hash\tentity_type\tmsa\tsequence\n{'c' * 64}\tprotein\t\t{YEAST_PEPTIDE[::-1]}\n")
    later = stage_msas(chains, tmp_path / "staged" / "msa_manifest.tsv", config)
    assert later.searched == 1 and list(later.manifest["depth"]) == [1]
    indexes = sorted(path.name for path in cache.glob("colabfold-index/*/*.idx"))
    assert indexes == [f"{database.environmental}.idx", f"{database.uniref}.idx"]


def test_gpu_search_flags_padded_layout_and_a_cpu_build(database, tmp_path):
    """MMseqs2's GPU search as colabfold_search asks for it (--gpu 1, ungapped prefilter, no -s),
    against a padded database written by the pinned MMseqs2's makepaddedseqdb; the pinned build has
    no CUDA, so `auto` stays on the CPU and `on` is a one-line error. The GPU itself is untested here."""
    cpu = colabfold.Runner(tmp_path, colabfold.ColabFoldSettings(sensitivity=7.5)).search_flags()
    gpu = colabfold.Runner(tmp_path, colabfold.ColabFoldSettings(sensitivity=7.5, gpu=True)).search_flags()
    assert cpu[-4:] == ["--prefilter-mode", "0", "-s", "7.5"]
    assert gpu[-4:] == ["--gpu", "1", "--prefilter-mode", "1"] and "-s" not in gpu
    assert colabfold.ColabFoldSettings(gpu=True).describe() != colabfold.ColabFoldSettings().describe()

    binary = mmseqs_binary()
    assert not colabfold.cuda_build(binary)
    assert not colabfold.use_gpu("auto", database) and not colabfold.use_gpu("off", database)
    with pytest.raises(FoldmillError, match="msa.gpu is on but .* is MMseqs2 without CUDA"):
        colabfold.use_gpu("on", database)
    with pytest.raises(FoldmillError, match=r"_db: not laid out for MMseqs2's GPU search \(build it with `mmseqs make"):
        database.search_target(database.uniref, gpu=True)

    padded = tmp_path / "padded"
    padded.mkdir()
    for path in database.root.iterdir():
        (padded / path.name).symlink_to(path)
    databases = colabfold.ColabFoldDatabases.find(padded)
    for name in databases.names():
        subprocess.run([binary, "makepaddedseqdb", databases.path(name), databases.path(name, "_pad"), "-v", "1"],
                       check=True, capture_output=True)  # fmt: skip
    assert databases.padded() and colabfold.is_padded(databases.path(databases.uniref, "_pad"))
    assert databases.search_target(databases.uniref, gpu=True) == databases.path(databases.uniref, "_pad")
    assert databases.search_target(databases.uniref) == databases.path(databases.uniref)
    with pytest.raises(FoldmillError) as error:  # the real GPU search, as far as a CPU build goes
        colabfold.unpaired_msas([YEAST_PEPTIDE], databases, tmp_path / "run", colabfold.ColabFoldSettings(gpu=True))
    assert str(error.value).startswith("mmseqs search failed (exit 1): ")
    assert "compiled without CUDA support" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("on_failure", ["reject", "fallback"])
def test_an_unusable_database_costs_no_target_and_falls_back_only_if_configured(database, tmp_path, on_failure):
    """A half-built ColabFold directory or a missing database: one line naming it; the chains are
    rejected with it, or (msa.on_failure: fallback) single-sequence with it as their note."""
    half = tmp_path / "half"
    half.mkdir()
    for path in database.root.iterdir():
        if not path.name.startswith(f"{database.uniref}_aln"):
            (half / path.name).symlink_to(path)
    chains = tmp_path / "unique_chains.tsv"
    chains.write_text(f"chain_hash\tentity_type\tmsa\tsequence\n{'a' * 16}\tprotein\t\t{YEAST_PEPTIDE}\n")
    problems = {
        half: f"{half / database.uniref}_aln: missing or half-built ColabFold database part",
        tmp_path / "absent.fasta": f"{tmp_path / 'absent.fasta'}: sequence database cannot be read",
    }
    for where, problem in problems.items():
        config = MSAStagingConfig.from_config({"mode": "search", "database": str(where), "on_failure": on_failure})
        staged = tmp_path / where.name
        result = stage_msas(chains, staged / "msa_manifest.tsv", config, rejects_path=staged / "msa_rejects.tsv")
        if on_failure == "reject":
            assert result.manifest.empty and len(result.rejects) == 1
            assert result.rejects["problem"].iloc[0].startswith(problem), result.rejects["problem"].iloc[0]
            assert result.rejects["source"].iloc[0] == str(where)
        else:
            assert result.rejects.empty and result.manifest["source"].tolist() == ["fallback"]
            assert result.manifest["note"].iloc[0].startswith(problem) and result.manifest["depth"].tolist() == [1]
        assert "\n" not in problem
