"""Rule `stage_templates`: thin wrapper over foldmill.templates.staging."""

from foldmill.runtime.rulescript import run_rule
from foldmill.templates.staging import TemplateStagingConfig, stage_templates


def main(snakemake) -> None:
    config = TemplateStagingConfig.from_config(
        snakemake.params.templates, snakemake.params.cache_dir, snakemake.threads
    )
    stage_templates(snakemake.input.worklist, snakemake.output.manifest, config, rejects_path=snakemake.output.rejects)


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
