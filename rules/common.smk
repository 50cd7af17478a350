# Shared set-up for every rules file (config validation, output paths, the list of final outputs).
from pathlib import Path

from snakemake.utils import validate

validate(config, workflow.source_path("../workflow/schemas/config.schema.yaml"))

OUTDIR = Path(config["outdir"])
LOGDIR = OUTDIR / "logs"
# Each rule file appends what `rule all` should build.
FINAL_OUTPUTS = []


def script_path(name):
    """A script of this workflow, resolved against its source so foldmill works as a module."""
    return workflow.source_path(f"../workflow/scripts/{name}")


def env_path(name):
    return workflow.source_path(f"../envs/{name}")
