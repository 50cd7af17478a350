# Shards: the worklist split by token budget; each shard is one GPU `fold` job.


checkpoint shards:
    input:
        rules.worklist.output.tsv,
    output:
        directory(OUTDIR / "shards"),
    params:
        tokens_per_shard=config["sharding"]["tokens_per_shard"],
        max_shards=config["sharding"]["max_shards"],
    log:
        LOGDIR / "shards.log",
    conda:
        env_path("foldmill.yaml")
    script:
        script_path("shards.py")


def shard_ids(wildcards):
    """Ids of the shards the `shards` checkpoint wrote (re-evaluated once it has run)."""
    shard_dir = checkpoints.shards.get().output[0]
    return sorted(Path(p).stem for p in Path(shard_dir).glob("shard_*.tsv"))
