"""Rule `fold`: thin wrapper over foldmill.executor.run.fold_targets.

Inside a Slurm job, Ray gets the CPUs of the allocation, and a multi-node allocation becomes one
Ray cluster for the job (foldmill.runtime.ray_slurm) that the executor joins.
"""

from dataclasses import replace
from pathlib import Path

from foldmill.errors import FoldmillError
from foldmill.executor.engine import Staging
from foldmill.executor.run import OutputSettings, fold_targets, read_work_items
from foldmill.executor.settings import executor_settings, model_settings
from foldmill.runtime.job_log import write_job_table
from foldmill.runtime.ray_slurm import current_allocation, ray_for_job
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    executor = executor_settings(snakemake.params.executor)
    if not executor.cpus:
        allocation = current_allocation()
        executor = replace(executor, cpus=allocation.cpus_per_node if allocation else snakemake.threads)
    with ray_for_job(executor.ray_address(), snakemake.params.ray_start_timeout_s) as address:
        run = fold_targets(
            read_work_items(snakemake.input.shard),
            Path(snakemake.params.outdir),
            Path(snakemake.output.table),
            model_settings(snakemake.params.model),
            replace(executor, address=address or executor.address),
            Staging(Path(snakemake.input.msa).parent),
            OutputSettings(snakemake.params.outputs["top_k"], snakemake.params.outputs["write_pdb"]),
        )
    write_job_table(snakemake.output.table, snakemake.wildcards.shard, snakemake.output.jobs)
    if run.abort_reason:
        raise FoldmillError(f"{snakemake.wildcards.shard}: {run.abort_reason}")


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
