"""Rule `shards`: thin wrapper over foldmill.runtime.sharding."""

import os

from foldmill.runtime.rulescript import run_rule
from foldmill.runtime.sharding import write_shards


def main(snakemake) -> None:
    # Test hook (environment FOLDMILL_TEST_OOM_BELOW_MB, set by the Slurm tests): die like a job
    # killed for memory unless Snakemake granted at least that much, to exercise retries with more memory.
    needed = int(os.environ.get("FOLDMILL_TEST_OOM_BELOW_MB", "0"))
    if needed and snakemake.resources.mem_mb < needed:
        raise MemoryError(f"simulated out-of-memory: granted {snakemake.resources.mem_mb} MB, needs {needed} MB")
    write_shards(
        snakemake.input.worklist,
        snakemake.output[0],
        tokens_per_shard=snakemake.params.tokens_per_shard,
        max_shards=snakemake.params.max_shards,
    )


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
