"""Split a worklist into shards by token budget, so 20,000 targets become tens of GPU jobs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from foldmill.io.atomic import atomic_path


def plan_shards(table: pd.DataFrame, tokens_per_shard: int, max_shards: int) -> list[pd.DataFrame]:
    """Greedy longest-first packing into at most `max_shards` shards of about `tokens_per_shard` tokens.

    Each target goes to the currently lightest shard (classic LPT scheduling), which keeps shard
    loads within one target of each other. The shard count is the token total over the budget,
    capped by `max_shards`, and at least one.
    """
    if table.empty:
        return []
    tokens = table["n_tokens"].astype(int)
    count = max(1, min(max_shards, -(-int(tokens.sum()) // max(1, tokens_per_shard)), len(table)))
    loads = [0] * count
    members: list[list[int]] = [[] for _ in range(count)]
    for position in tokens.sort_values(ascending=False, kind="stable").index:
        lightest = min(range(count), key=loads.__getitem__)
        loads[lightest] += int(tokens[position])
        members[lightest].append(position)
    return [table.loc[m] for m in members if m]


def write_shards(worklist_tsv: str | Path, outdir: str | Path, tokens_per_shard: int, max_shards: int) -> list[Path]:
    """Write shard_NNNN.tsv files (worklist rows) into `outdir`; returns their paths."""
    table = pd.read_csv(worklist_tsv, sep="\t", dtype={"content_hash": str, "chain_hashes": str}, keep_default_na=False)
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, shard in enumerate(plan_shards(table, tokens_per_shard, max_shards)):
        path = outdir / f"shard_{index:04d}.tsv"
        with atomic_path(path) as tmp:
            shard.to_csv(tmp, sep="\t", index=False)
        paths.append(path)
    return paths
