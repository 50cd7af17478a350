"""`foldmill bench msa`: MSAs per second by ColabFold's protocol, foldmill against ColabFold's own search.

In one run, against the same ColabFold-format database, with the same MMseqs2 and threads:
- ColabFold's `colabfold_search` (its `colabfold.mmseqs.search` entry point, run as that command
  runs it, from the package folder given by `--colabfold`) over the query FASTA;
- foldmill's staging (`foldmill.msa.staging.stage_msas`, what the workflow runs) with nothing
  cached (the databases' first search: no index), then again with its MSAs dropped (a second
  search of the databases: it builds its MMseqs2 index of them, msa.index_max_gb, and searches);
- foldmill's batched run (`foldmill.msa.colabfold.search`) over the same queries with that index,
  and without any index, each checked equal to ColabFold's A3Ms query by query;
- foldmill's staging again, from its cache.
Writes msa_bench.json and msa_bench.md to --out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from foldmill.bench._out_dir import writes_only_its_own
from foldmill.errors import FoldmillError
from foldmill.io.atomic import write_text_atomic
from foldmill.msa import colabfold
from foldmill.msa.mmseqs import mmseqs_binary
from foldmill.msa.staging import MSAStagingConfig, stage_msas


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("msa", help="ColabFold-protocol MSAs: foldmill's batched run vs colabfold_search")
    parser.add_argument("--queries", required=True, help="protein FASTA (e.g. a proteome)")
    parser.add_argument("--database", required=True, help="ColabFold database directory (uniref30_*_db, ...)")
    parser.add_argument("--colabfold", default=".venv/colabfold-oracle", help="folder holding the colabfold package")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default="results/bench/msa")
    parser.set_defaults(handler=writes_only_its_own(run))


def read_fasta(path: Path) -> dict[str, str]:
    sequences: dict[str, list[str]] = {}
    name = None
    for line in path.read_text().splitlines():
        if line.startswith(">"):
            name = f"q{len(sequences)}"
            sequences[name] = []
        elif name is not None:
            sequences[name].append(line.strip())
    return {name: "".join(parts) for name, parts in sequences.items() if parts}


def timed(contender: str, call) -> tuple[dict, object]:
    """The table row of `call` (its wall seconds, and the CPU seconds, user + system, of the
    subprocesses it ran, which a machine shared with other jobs slows less), and its result."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = call()
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {"contender": contender, "seconds": round(seconds, 2), "cpu_seconds": round(cpu, 1)}, result


def run_colabfold_search(fasta: Path, databases: colabfold.ColabFoldDatabases, out: Path, package: Path,
                         threads: int) -> None:  # fmt: skip
    arguments = [
        str(fasta), str(databases.root), str(out), "--db1", databases.uniref, "--mmseqs", mmseqs_binary(),
        "--threads", str(threads), "--use-env", "1" if databases.environmental else "0",
    ]  # fmt: skip
    if databases.environmental:
        arguments += ["--db3", databases.environmental]
    code = f"import sys; sys.argv = ['colabfold_search'] + {arguments!r}; "
    code += "from colabfold.mmseqs.search import main; main()"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(package)}, check=False)  # fmt: skip
    if result.returncode != 0:
        tail = " | ".join(result.stderr.strip().splitlines()[-2:])
        raise FoldmillError(f"colabfold_search failed (exit {result.returncode}): {tail}")


def run(args: argparse.Namespace) -> int:
    queries = read_fasta(Path(args.queries))
    if not queries:
        raise FoldmillError(f"{args.queries}: no sequences")
    package = Path(args.colabfold)
    if not (package / "colabfold").is_dir():
        raise FoldmillError(
            f"{package}: no colabfold package there (pip install --no-deps --target {package} colabfold)"
        )
    databases = colabfold.ColabFoldDatabases.find(args.database)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = colabfold.ColabFoldSettings(threads=args.threads)
    rows = []
    with tempfile.TemporaryDirectory(prefix="msa-bench-") as scratch:
        scratch = Path(scratch)
        fasta = scratch / "queries.fasta"
        fasta.write_text("".join(f">{name}\n{sequence}\n" for name, sequence in queries.items()))

        row, _ = timed("colabfold_search",
                       lambda: run_colabfold_search(fasta, databases, scratch / "colabfold", package, args.threads))
        rows.append(row)
        theirs = {name: (scratch / "colabfold" / f"{name}.a3m").read_text() for name in queries}

        chains = scratch / "unique_chains.tsv"
        unique = {hashlib.sha256(sequence.encode()).hexdigest(): sequence for sequence in queries.values()}
        chains.write_text("chain_hash\tentity_type\tmsa\tsequence\n"
                          + "".join(f"{h}\tprotein\t\t{s}\n" for h, s in unique.items()))  # fmt: skip
        cache = scratch / "cache"
        config = MSAStagingConfig.from_config(
            {"mode": "search", "database": args.database, "threads": args.threads, "cache_dir": str(cache)}
        )

        def staging() -> object:
            return stage_msas(chains, scratch / "staged" / "msa_manifest.tsv", config)

        rows.append(timed("foldmill staging, nothing cached", staging)[0])
        # the same queries again with their MSAs dropped: a second search of these databases, which
        # builds the private index first
        for path in cache.iterdir():
            if not path.name.startswith("colabfold-index"):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        rows.append(timed("foldmill staging, second search (index built)", staging)[0])

        indexed = colabfold.with_search_index(databases, cache, args.threads, config.index_max_gb)
        for label, searched in (("with the index", indexed), ("without an index", databases)):
            workdir = scratch / label
            row, (ours, _) = timed(
                f"foldmill colabfold.search, {label}",
                lambda searched=searched, workdir=workdir: colabfold.search(queries, {}, searched, workdir, settings),
            )
            equal = sum(ours[name] == theirs[name] for name in queries)
            rows.append({**row, "equal_to_colabfold": f"{equal}/{len(queries)}"})
            shutil.rmtree(scratch / label, ignore_errors=True)

        rows.append(timed("foldmill staging, from cache", staging)[0])
        shutil.rmtree(scratch / "colabfold", ignore_errors=True)

    baseline = rows[0]["seconds"]
    for row in rows:
        row["msas_per_second"] = round(len(queries) / row["seconds"], 2)
        row["speedup_vs_colabfold_search"] = round(baseline / row["seconds"], 2)
    report = {"queries": len(queries), "threads": args.threads, "database": str(databases.root), "rows": rows}
    write_text_atomic(out / "msa_bench.json", json.dumps(report, indent=1) + "\n")
    write_text_atomic(out / "msa_bench.md", markdown(report))
    print(markdown(report))
    return 0


def markdown(report: dict) -> str:
    lines = [
        f"{report['queries']} queries, {report['threads']} threads, database {report['database']}",
        "",
        "| contender | seconds | MSAs/s | vs colabfold_search | CPU seconds | equal A3Ms |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['contender']} | {row['seconds']} | {row['msas_per_second']} "
            f"| {row['speedup_vs_colabfold_search']}x | {row['cpu_seconds']} | {row.get('equal_to_colabfold', '')} |"
        )
    return "\n".join(lines) + "\n"
