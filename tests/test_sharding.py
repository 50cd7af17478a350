"""Sharding the worklist into GPU jobs by token budget, and sizing those jobs (foldmill.runtime.sharding)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from foldmill.errors import InputError
from foldmill.runtime.sharding import (
    JobSizing,
    ShardStats,
    job_resources,
    plan_shards,
    read_manifest,
    shard_count,
    shard_job_resources,
    write_shards,
)


def worklist(tokens: list[int]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "target_id": [f"T{i:05d}" for i in range(len(tokens))],
            "content_hash": [f"{i:016x}" for i in range(len(tokens))],  # leading zeros must survive
            "n_tokens": tokens,
        }
    )


def proteome_tokens(count: int, seed: int = 0) -> list[int]:
    """Protein lengths shaped like a proteome (log-normal, median ~420)."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(420), 0.6, count).astype(int), 30, 5000).tolist()


def test_proteome_becomes_tens_of_balanced_size_banded_shards():
    table = worklist(proteome_tokens(20_000))
    shards = plan_shards(table, tokens_per_shard=200_000, max_shards=100)
    total = int(table["n_tokens"].sum())

    assert len(shards) == shard_count(total, len(table), 200_000, 100) == -(-total // 200_000)
    assert sorted(pd.concat(shards)["target_id"]) == sorted(table["target_id"])  # each target exactly once
    largest = int(table["n_tokens"].max())
    mean = total / len(shards)
    for shard in shards:
        assert abs(int(shard["n_tokens"].sum()) - mean) <= largest
    # Size bands: every target of a shard is at least as large as every target of the next one.
    for bigger, smaller in zip(shards, shards[1:]):
        assert bigger["n_tokens"].min() >= smaller["n_tokens"].max()


def test_max_shards_caps_the_job_count():
    table = worklist(proteome_tokens(5_000))
    shards = plan_shards(table, tokens_per_shard=1_000, max_shards=7)
    assert len(shards) == 7
    assert sum(len(s) for s in shards) == 5_000


def test_plan_does_not_depend_on_input_order():
    table = worklist([300, 300, 120, 900, 300, 50, 50, 700])
    shuffled = table.sample(frac=1.0, random_state=3)
    first = [list(s["target_id"]) for s in plan_shards(table, 1_000, 10)]
    second = [list(s["target_id"]) for s in plan_shards(shuffled, 1_000, 10)]
    assert first == second


def test_target_over_budget_gets_a_shard_of_its_own():
    shards = plan_shards(worklist([5_000, 100, 100, 100]), tokens_per_shard=1_000, max_shards=10)
    assert [list(s["n_tokens"]) for s in shards] == [[5_000], [100, 100, 100]]


def test_small_and_empty_worklists():
    assert plan_shards(worklist([]), 1_000, 10) == []
    assert [len(s) for s in plan_shards(worklist([10, 20]), 1_000, 10)] == [2]


def test_write_shards_files_and_manifest(tmp_path):
    table = worklist(proteome_tokens(300, seed=1))
    source = tmp_path / "worklist.tsv"
    table.to_csv(source, sep="\t", index=False)

    paths = write_shards(source, tmp_path / "shards", tokens_per_shard=20_000, max_shards=100)

    assert [p.name for p in paths] == [f"shard_{i:04d}.tsv" for i in range(len(paths))]
    manifest = read_manifest(tmp_path / "shards")
    assert list(manifest) == [p.stem for p in paths]
    rows = []
    for path in paths:
        shard = pd.read_csv(path, sep="\t", dtype={"content_hash": str})
        stats = manifest[path.stem]
        assert (stats.n_targets, stats.n_tokens, stats.max_tokens) == (
            len(shard),
            int(shard["n_tokens"].sum()),
            int(shard["n_tokens"].max()),
        )
        rows.append(shard)
    merged = pd.concat(rows).sort_values("target_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(merged, table.sort_values("target_id").reset_index(drop=True), check_dtype=False)

    # Every shard's job, sized once per manifest and attempt, as job_resources sizes it alone;
    # a manifest written anew (the checkpoint rerun) is read anew.
    sizing = JobSizing()
    sized = shard_job_resources(tmp_path / "shards", sizing, gpus=2, attempt=2)
    assert sized == {shard: job_resources(stats, sizing, 2, 2) for shard, stats in manifest.items()}
    write_shards(source, tmp_path / "shards", tokens_per_shard=1_000_000, max_shards=100)
    assert list(shard_job_resources(tmp_path / "shards", sizing, gpus=2, attempt=2)) == ["shard_0000"]


def test_write_shards_rejects_a_table_that_is_no_worklist(tmp_path):
    source = tmp_path / "not_a_worklist.tsv"
    source.write_text("name\tlength\nx\t3\n")
    with pytest.raises(InputError, match="not_a_worklist.tsv: header: not a worklist"):
        write_shards(source, tmp_path / "shards", 1_000, 10)


def test_job_resources_follow_tokens_gpus_and_attempt():
    sizing = JobSizing(residues_per_gpu_hour=20_000, startup_minutes=15, mem_mb_per_gpu=16_000, mem_mb_per_token=4)
    shard = ShardStats("shard_0000", n_targets=400, n_tokens=200_000, max_tokens=2_000)

    one = job_resources(shard, sizing, gpus=1)
    assert one.runtime_minutes == 15 + 600  # 200,000 tokens at 20,000 per GPU-hour
    assert one.mem_mb == 16_000 + 4 * 2_000

    four = job_resources(shard, sizing, gpus=4)
    assert four.runtime_minutes == 15 + 150
    assert four.mem_mb == 4 * (16_000 + 4 * 2_000)

    retry = job_resources(shard, sizing, gpus=1, attempt=2)
    assert (retry.runtime_minutes, retry.mem_mb) == (2 * one.runtime_minutes, 2 * one.mem_mb)


def test_job_resources_caps():
    sizing = JobSizing(max_runtime_minutes=120, max_mem_mb=30_000)
    shard = ShardStats("shard_0000", n_targets=10, n_tokens=1_000_000, max_tokens=5_000)
    capped = job_resources(shard, sizing, gpus=1, attempt=3)
    assert (capped.runtime_minutes, capped.mem_mb) == (120, 30_000)


def test_job_sizing_from_config_section():
    sizing = JobSizing.from_config({"residues_per_gpu_hour": 50_000, "gpus_per_node": 4, "startup_minutes": 5})
    assert (sizing.residues_per_gpu_hour, sizing.startup_minutes, sizing.mem_mb_per_gpu) == (50_000, 5, 16_000)
