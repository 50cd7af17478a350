"""Rule `shards`: thin wrapper over foldmill.runtime.sharding."""

from foldmill.errors import FoldmillError
from foldmill.runtime.rulescript import run_rule
from foldmill.runtime.sharding import write_shards


def main(snakemake) -> None:
    # Test hook (config slurm.simulate_oom_below_mem_mb, 0 = off): fail like a job killed for
    # memory unless Snakemake granted at least that much, to exercise retries with more memory.
    needed = snakemake.params.simulate_oom_below_mem_mb
    if needed and snakemake.resources.mem_mb < needed:
        raise FoldmillError(f"simulated out-of-memory: granted {snakemake.resources.mem_mb} MB, needs {needed} MB")
    write_shards(
        snakemake.input[0],
        snakemake.output[0],
        tokens_per_shard=snakemake.params.tokens_per_shard,
        max_shards=snakemake.params.max_shards,
    )


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
