"""A small ColabFold-format sequence database built from real UniRef sequences, for the MSA tests.

ColabFold's `setup_databases.sh` unpacks UniRef30 as four tables (`NAME.tsv` cluster consensus
sequences, `NAME_h.tsv` headers, `NAME_seq.tsv` member sequences, `NAME_aln.tsv` member-to-cluster
alignments), turns them into an expandable profile database with `mmseqs tsv2exprofiledb`, indexes
it with `mmseqs createindex` and keeps the taxonomy mapping `NAME_db_mapping` beside it for pairing.
This module makes those four tables from the sequences of A3M files (clustered with `mmseqs
cluster`, aligned member to representative with `mmseqs align`) and then runs the same two
commands, so the searches under test read a database laid out exactly as a user's would be.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from foldmill.msa.colabfold import read_database

TAXID = re.compile(r"TaxID=(\d+)")


def a3m_sequences(paths: list[Path]) -> list[tuple[str, str, int]]:
    """(header, ungapped sequence, taxid or 0) of every row but the query of each A3M, first seen wins."""
    seen: set[str] = set()
    records: list[tuple[str, str, int]] = []
    for path in paths:
        header, rows = None, []
        entries: list[tuple[str, str]] = []
        for line in path.read_text().splitlines():
            if line.startswith(">"):
                if header is not None:
                    entries.append((header, "".join(rows)))
                header, rows = line[1:].strip(), []
            elif header is not None and not line.startswith("#"):
                rows.append(line.strip())
        if header is not None:
            entries.append((header, "".join(rows)))
        for header, aligned in entries[1:]:
            sequence = aligned.replace("-", "").upper()
            if len(sequence) < 20 or sequence in seen:
                continue
            seen.add(sequence)
            taxid = TAXID.search(header)
            records.append((header.split("\t")[0], sequence, int(taxid.group(1)) if taxid else 0))
    return records


def build(mmseqs: str, a3m_paths: list[Path], dbbase: Path, name: str, workdir: Path, min_seq_id: float = 0.3,
          index: bool = False) -> Path:
    """Write `dbbase/{name}_db*` (expandable profile DB, index, taxonomy mapping); returns dbbase."""
    def run(*arguments: object) -> None:
        # One data file per database (not one per thread), so read_db can read it.
        environment = {**os.environ, "MMSEQS_FORCE_MERGE": "1"}
        subprocess.run([mmseqs, *map(str, arguments), "-v", "1"], check=True, capture_output=True, env=environment)

    workdir.mkdir(parents=True, exist_ok=True)
    dbbase.mkdir(parents=True, exist_ok=True)
    records = a3m_sequences(a3m_paths)
    fasta = workdir / "members.fasta"
    fasta.write_text("".join(f">{header}\n{sequence}\n" for header, sequence, _ in records))
    run("createdb", fasta, workdir / "seq", "--shuffle", "0", "--dbtype", "1")
    run("cluster", workdir / "seq", workdir / "clu", workdir / "tmp", "--min-seq-id", min_seq_id, "-c", "0.8",
        "--threads", "2")
    run("align", workdir / "seq", workdir / "seq", workdir / "clu", workdir / "aln", "-a", "-e", "inf",
        "--alignment-mode", "3", "--threads", "2")
    sequences = read_database(workdir / "seq")
    headers = read_database(workdir / "seq_h")
    alignments = read_database(workdir / "aln")

    base = workdir / name
    with open(f"{base}_seq.tsv", "w") as handle:
        handle.writelines(f"{key}\t{sequences[key].strip()}\n" for key in sorted(sequences))
    with open(f"{base}_h.tsv", "w") as handle:
        handle.writelines(f"{key}\t{headers[key].strip()}\n" for key in sorted(headers))
    # Each cluster is searched through its representative's sequence and expanded to its members.
    with open(f"{base}.tsv", "w") as handle:
        handle.writelines(f"{key}\t{sequences[key].strip()}\n" for key in sorted(alignments))
    with open(f"{base}_aln.tsv", "w") as handle:
        for key in sorted(alignments):
            for row in alignments[key].splitlines():
                handle.write(f"{key}\t{row}\n")
    target = dbbase / f"{name}_db"
    run("tsv2exprofiledb", base, target)
    if index:
        run("createindex", target, workdir / "tmp_index", "--remove-tmp-files", "1", "--threads", "2")
    lookup = {}
    for line in (workdir / "seq.lookup").read_text().splitlines():
        key, name = line.split("\t")[:2]
        lookup[name] = int(key)
    taxids = {header.split()[0]: taxid for header, _, taxid in records}
    with open(f"{target}_mapping", "w") as handle:
        handle.writelines(f"{lookup[name]}\t{taxids[name]}\n" for name in sorted(lookup, key=lookup.get))
    write_taxonomy(target, sorted({taxid for taxid in taxids.values() if taxid}))
    return dbbase


def write_taxonomy(target: Path, taxids: list[int]) -> None:
    """NCBI taxonomy dump files beside the database: every species directly under the root.

    Pairing (`mmseqs pairaln`) reads them with the mapping to group hits by species; a real
    database carries NCBI's full dump (or `NAME_db_taxonomy`) instead."""
    Path(f"{target}_nodes.dmp").write_text(
        "1\t|\t1\t|\tno rank\t|\n" + "".join(f"{taxid}\t|\t1\t|\tspecies\t|\n" for taxid in taxids)
    )
    Path(f"{target}_names.dmp").write_text(
        "1\t|\troot\t|\t\t|\tscientific name\t|\n"
        + "".join(f"{taxid}\t|\ttaxon {taxid}\t|\t\t|\tscientific name\t|\n" for taxid in taxids)
    )
    Path(f"{target}_merged.dmp").write_text("")


def build_test_databases(mmseqs: str, root: Path) -> Path:
    """The UniRef30-like and environmental test databases, from tests/data/msas, in `root`/db."""
    a3ms = sorted((Path(__file__).parent / "data" / "msas").glob("*.a3m"))
    build(mmseqs, a3ms, root / "db", "uniref30_test", root / "work_uniref", min_seq_id=0.3)
    build(mmseqs, a3ms, root / "db", "colabfold_envdb_test", root / "work_env", min_seq_id=0.5)
    return root / "db"


if __name__ == "__main__":
    # python tests/colabfold_db.py DIR: the test databases (UniRef30-like and environmental) in DIR,
    # e.g. for `foldmill bench msa --database DIR`.
    import shutil
    import sys
    import tempfile

    from foldmill.msa.mmseqs import mmseqs_binary

    with tempfile.TemporaryDirectory() as work:
        built = build_test_databases(mmseqs_binary(), Path(work))
        shutil.copytree(built, sys.argv[1], dirs_exist_ok=True)
