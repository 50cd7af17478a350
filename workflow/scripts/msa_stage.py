"""Rule `stage_msas`: thin wrapper over foldmill.msa.staging."""

from foldmill.msa.staging import MSAStagingConfig, stage_msas
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    config = MSAStagingConfig.from_config(snakemake.params.msa, snakemake.params.cache_dir, snakemake.threads)
    stage_msas(
        snakemake.input.chains,
        snakemake.output.manifest,
        config,
        worklist_tsv=snakemake.input.worklist,
        rejects_path=snakemake.output.rejects,
    )


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
