"""Rule `export_archive`: thin wrapper over foldmill.outputs.export.archive_export."""

from foldmill.outputs.export import archive_export
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    archive_export(snakemake.input[0], snakemake.output[0])


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
