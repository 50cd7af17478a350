"""Rule `shards`: thin wrapper over foldmill.runtime.sharding."""

from foldmill.runtime.rulescript import run_rule
from foldmill.runtime.sharding import write_shards


def main(snakemake) -> None:
    write_shards(
        snakemake.input[0],
        snakemake.output[0],
        tokens_per_shard=snakemake.params.tokens_per_shard,
        max_shards=snakemake.params.max_shards,
    )


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
