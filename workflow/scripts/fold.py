"""Rule `fold`: thin wrapper over foldmill.executor.run.fold_targets."""

from dataclasses import replace
from pathlib import Path

from foldmill.errors import FoldmillError
from foldmill.executor.engine import Staging
from foldmill.executor.run import OutputSettings, fold_targets, read_work_items
from foldmill.executor.settings import executor_settings, model_settings
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    executor = executor_settings(snakemake.params.executor)
    if not executor.cpus:
        executor = replace(executor, cpus=snakemake.threads)
    run = fold_targets(
        read_work_items(snakemake.input.shard),
        Path(snakemake.params.outdir),
        Path(snakemake.output[0]),
        model_settings(snakemake.params.model),
        executor,
        Staging(Path(snakemake.input.msa).parent),
        OutputSettings(snakemake.params.outputs["top_k"], snakemake.params.outputs["write_pdb"]),
    )
    if run.abort_reason:
        raise FoldmillError(f"{snakemake.wildcards.shard}: {run.abort_reason}")


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
