"""Rule `check_model`: validate the checkpoint before any staging or fold job (foldmill.model.checkpoint)."""

from pathlib import Path

from foldmill.model.checkpoint import check_checkpoint
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    checkpoint = snakemake.params.checkpoint
    summary = "demo: seeded random weights" if checkpoint == "demo" else check_checkpoint(checkpoint)
    Path(snakemake.output[0]).write_text(summary + "\n")


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
