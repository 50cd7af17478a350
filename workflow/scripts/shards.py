"""Rule `shards`: thin wrapper over foldmill.runtime.sharding."""

import os
import time

from foldmill.runtime.rulescript import run_rule
from foldmill.runtime.sharding import write_shards


def main(snakemake) -> None:
    # Test hook (environment FOLDMILL_TEST_OOM_BELOW_MB, set by the Slurm tests): unless Snakemake
    # granted at least that much, use that much memory for a few seconds, so that Slurm kills the
    # job for memory (retried with more); where nothing kills it, fail as if it had been.
    needed = int(os.environ.get("FOLDMILL_TEST_OOM_BELOW_MB", "0"))
    if needed and snakemake.resources.mem_mb < needed:
        ballast = b"\1" * (needed * 2**20)  # written, so resident
        time.sleep(10)
        del ballast
        raise MemoryError(f"simulated out-of-memory: granted {snakemake.resources.mem_mb} MB, needs {needed} MB")
    write_shards(
        snakemake.input.worklist,
        snakemake.output[0],
        tokens_per_shard=snakemake.params.tokens_per_shard,
        max_shards=snakemake.params.max_shards,
    )


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
