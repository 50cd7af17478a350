"""Rule `export_archive`: thin wrapper over foldmill.outputs.export.archive_export."""

from pathlib import Path

from foldmill.outputs.export import archive_export
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    # The input is the export's manifest.tsv: the archive packs the folder holding it.
    archive_export(Path(snakemake.input[0]).parent, snakemake.output[0])


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
