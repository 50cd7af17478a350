"""Proteome-scale sharding: split the worklist into GPU jobs by token budget, and size each job.

20,000 targets must become tens of `fold` jobs, not 20,000: each shard holds about
`tokens_per_shard` tokens. Shards are contiguous bands of the worklist sorted by size, so a shard
of small proteins asks Slurm for little memory and a shard of large complexes for more (memory
follows a shard's largest target). `shards/manifest.tsv` records each shard's token counts;
`job_resources` turns them into the memory and runtime a shard's job requests.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from foldmill.errors import InputError
from foldmill.io.atomic import atomic_path

MANIFEST_NAME = "manifest.tsv"
MANIFEST_COLUMNS = ["shard_id", "n_targets", "n_tokens", "max_tokens"]


def shard_count(total_tokens: int, n_targets: int, tokens_per_shard: int, max_shards: int) -> int:
    """Shards needed for `total_tokens` at `tokens_per_shard` each: at least 1, at most max_shards and n_targets."""
    wanted = math.ceil(total_tokens / max(1, tokens_per_shard))
    return max(1, min(wanted, max_shards, n_targets))


def plan_shards(table: pd.DataFrame, tokens_per_shard: int, max_shards: int) -> list[pd.DataFrame]:
    """Split worklist rows into size-banded shards of about equal tokens, largest targets first.

    Targets are sorted by tokens (descending; ties by target_id, so plans are reproducible) and
    cut into `shard_count` contiguous bands: a target goes to the band its token midpoint falls
    in, which keeps every band within one target of total/count tokens. A target larger than
    the budget simply gets a shard of its own. Empty bands (behind a very large target) vanish.
    """
    if table.empty:
        return []
    ordered = table.assign(_tokens=table["n_tokens"].astype(int))
    ordered = ordered.sort_values(["_tokens", "target_id"], ascending=[False, True], kind="stable")
    tokens = ordered["_tokens"].to_numpy()
    count = shard_count(int(tokens.sum()), len(ordered), tokens_per_shard, max_shards)
    band_tokens = tokens.sum() / count
    midpoints = tokens.cumsum() - tokens / 2
    band = (midpoints // band_tokens).astype(int).clip(0, count - 1)
    ordered = ordered.drop(columns="_tokens")
    return [ordered[band == index] for index in range(count) if (band == index).any()]


def shard_name(index: int) -> str:
    return f"shard_{index:04d}"


def write_shards(worklist_tsv: str | Path, outdir: str | Path, tokens_per_shard: int, max_shards: int) -> list[Path]:
    """Write shard_NNNN.tsv files (worklist rows) and manifest.tsv into `outdir`; returns the shard paths."""
    table = pd.read_csv(worklist_tsv, sep="\t", dtype={"content_hash": str, "chain_hashes": str}, keep_default_na=False)
    if "n_tokens" not in table.columns or "target_id" not in table.columns:
        raise InputError(str(worklist_tsv), "header", "not a worklist: needs the columns target_id and n_tokens")
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    paths, manifest = [], []
    for index, shard in enumerate(plan_shards(table, tokens_per_shard, max_shards)):
        path = outdir / f"{shard_name(index)}.tsv"
        with atomic_path(path) as tmp:
            shard.to_csv(tmp, sep="\t", index=False)
        paths.append(path)
        tokens = shard["n_tokens"].astype(int)
        manifest.append((shard_name(index), len(shard), int(tokens.sum()), int(tokens.max())))
    with atomic_path(outdir / MANIFEST_NAME) as tmp:
        pd.DataFrame(manifest, columns=MANIFEST_COLUMNS).to_csv(tmp, sep="\t", index=False)
    return paths


@dataclass(frozen=True)
class ShardStats:
    shard_id: str
    n_targets: int
    n_tokens: int
    max_tokens: int


def read_manifest(shard_dir: str | Path) -> dict[str, ShardStats]:
    """The manifest `write_shards` wrote, by shard id (cached while the file is unchanged:
    Snakemake asks for every shard job's resources, possibly several times)."""
    path = Path(shard_dir) / MANIFEST_NAME
    return _read_manifest(str(path), _version(path))


def _version(path: Path) -> tuple[int, int]:
    """What changes when the file is written anew (a cache key)."""
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=8)
def _read_manifest(path: str, version: tuple[int, int]) -> dict[str, ShardStats]:
    table = pd.read_csv(path, sep="\t", dtype={"shard_id": str})
    return {
        row.shard_id: ShardStats(row.shard_id, int(row.n_targets), int(row.n_tokens), int(row.max_tokens))
        for row in table.itertuples(index=False)
    }


@dataclass(frozen=True)
class JobSizing:
    """How a shard's tokens become a fold job's memory and runtime (config `slurm:`; see config/README.md).

    Runtime: start-up plus the shard's tokens at `residues_per_gpu_hour` per GPU. Memory: per GPU
    (one model replica each) a base plus a share proportional to the shard's largest target,
    whose features and outputs dominate host memory. Both grow with the attempt, so a job that
    ran out of memory or time is resubmitted with more, up to the caps (0 = no cap).
    """

    residues_per_gpu_hour: float = 20000.0
    startup_minutes: int = 15
    mem_mb_per_gpu: int = 16000
    mem_mb_per_token: float = 4.0
    max_runtime_minutes: int = 2880
    max_mem_mb: int = 0

    @classmethod
    def from_config(cls, section: dict) -> JobSizing:
        return cls(**{key: section[key] for key in cls.__dataclass_fields__ if key in section})


@dataclass(frozen=True)
class JobResources:
    mem_mb: int
    runtime_minutes: int


def job_resources(stats: ShardStats, sizing: JobSizing, gpus: int, attempt: int = 1) -> JobResources:
    """Memory (MB) and runtime (minutes) for folding one shard on `gpus` GPUs, at Snakemake attempt `attempt`."""
    gpus, attempt = max(1, gpus), max(1, attempt)
    fold_minutes = 60.0 * stats.n_tokens / (sizing.residues_per_gpu_hour * gpus)
    runtime = math.ceil((sizing.startup_minutes + fold_minutes) * attempt)
    mem_mb = math.ceil(gpus * (sizing.mem_mb_per_gpu + sizing.mem_mb_per_token * stats.max_tokens) * attempt)
    if sizing.max_runtime_minutes:
        runtime = min(runtime, sizing.max_runtime_minutes)
    if sizing.max_mem_mb:
        mem_mb = min(mem_mb, sizing.max_mem_mb)
    return JobResources(mem_mb=mem_mb, runtime_minutes=runtime)


def shard_job_resources(
    shard_dir: str | Path, sizing: JobSizing, gpus: int, attempt: int = 1
) -> dict[str, JobResources]:
    """`job_resources` of every shard in the manifest, by shard id, computed once per manifest and
    attempt: Snakemake plans every fold job's memory and runtime, and 10,000 jobs each sizing
    its shard anew showed in the planning time."""
    path = Path(shard_dir) / MANIFEST_NAME
    return _shard_job_resources(str(path), _version(path), sizing, gpus, attempt)


@functools.lru_cache(maxsize=8)
def _shard_job_resources(
    path: str, version: tuple[int, int], sizing: JobSizing, gpus: int, attempt: int
) -> dict[str, JobResources]:
    manifest = _read_manifest(path, version)
    return {shard: job_resources(stats, sizing, gpus, attempt) for shard, stats in manifest.items()}
