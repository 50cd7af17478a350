# Shared set-up for every rules file (config validation, output paths, the list of final outputs).
import sys
from pathlib import Path

from foldmill.config import ConfigError, resolve_config, run_summary

# The schema's defaults filled in and every key checked (foldmill.config); a problem is one line.
try:
    resolved_config = resolve_config(config)
except ConfigError as error:
    raise SystemExit(f"foldmill: error: {error}") from None
config.clear()
config.update(resolved_config)
if workflow.is_main_process:
    print(run_summary(config), file=sys.stderr)

OUTDIR = Path(config["outdir"])
LOGDIR = OUTDIR / "logs"
# Each rule file appends what `rule all` should build.
FINAL_OUTPUTS = []


def script_path(name):
    """A script of this workflow, resolved against its source so foldmill works as a module."""
    return workflow.source_path(f"../workflow/scripts/{name}")


def env_path(name):
    return workflow.source_path(f"../envs/{name}")


def msa_database_input(wildcards):
    """The configured sequence database, so editing it re-stages (a FASTA or an MMseqs2 DB prefix)."""
    database = config["msa"]["database"]
    return [database] if database and config["msa"]["mode"] in ("auto", "search") else []


def template_search_inputs(wildcards):
    seqres = config["templates"]["seqres"]
    return [seqres] if seqres else []


def check_slurm_plan():
    """On Slurm, before the first submission: every planned job fits a node of its partition
    (rules/checks.smk). Called by the Snakefile's onstart (Snakemake keeps one onstart handler)."""
    if workflow.executor_plugin is not None and workflow.executor_plugin.name == "slurm":
        try:
            check_plan(
                workflow,
                fold_cpus=FOLD_CPUS,
                fold_gpus=SLURM["gpus_per_node"] if FOLD_ON_GPU else 0,
                # a fold job's least memory per node: the per-GPU base
                fold_mem_mb=-(-JOB_SIZING.mem_mb_per_gpu * max(1, SLURM["gpus_per_node"]) // shard_nodes),
                device=config["model"]["device"],
            )
        except FoldmillError as error:
            raise WorkflowError(str(error)) from None
