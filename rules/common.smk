# Shared set-up for every rules file (config validation, output paths, the list of final outputs).
import os
import sys
import time
from pathlib import Path

from foldmill.config import ConfigError, pretrains_only, resolve_config, run_summary
from foldmill.runtime.slurm_accounting import failure_lines, jobs_from_logs, query_jobs
from foldmill.runtime.slurm_jobs import slurm_job_resources

# The schema's defaults filled in and every key checked (foldmill.config); a problem is one line.
try:
    resolved_config = resolve_config(config)
except ConfigError as error:
    raise SystemExit(f"foldmill: error: {error}") from None
config.clear()
config.update(resolved_config)
if workflow.is_main_process:
    print(run_summary(config), file=sys.stderr)

RUN_STARTED = time.time()
# A config without inputs runs MoE pretraining alone (foldmill.config.pretrains_only): the
# Snakefile leaves the folding rules out.
FOLDING = not pretrains_only(config)
OUTDIR = Path(config["outdir"])
LOGDIR = OUTDIR / "logs"
# Each rule file appends what `rule all` should build.
FINAL_OUTPUTS = []


def slurm_resources(job_class=None, gpus=0):
    """Partition, account, QoS, constraint and extra sbatch options of a class of job (config
    `slurm:`), as resources of the rules, so that a command-line --set-resources changes one only."""
    return slurm_job_resources(config["slurm"], job_class, gpus)


def script_path(name):
    """A script of this workflow, resolved against its source so foldmill works as a module."""
    return workflow.source_path(f"../workflow/scripts/{name}")


def env_path(name):
    return workflow.source_path(f"../envs/{name}")


# envs/*.yaml install this checkout: pip expands ${FOLDMILL_CHECKOUT} when `--sdm conda` builds
# them. The folder above rules/ (a workflow loaded from a remote source has no checkout to install).
RULES_DIR = Path(workflow.current_basedir.get_path_or_uri(secret_free=True))
if RULES_DIR.is_dir():
    os.environ.update(FOLDMILL_CHECKOUT=str(RULES_DIR.resolve().parent))


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
            if not FOLDING:
                check_jobs(workflow)
                return
            check_plan(
                workflow,
                fold_cpus=FOLD_CPUS,
                fold_gpus=SLURM["gpus_per_node"] if FOLD_ON_GPU else 0,
                # a fold job's least memory per node: the per-GPU base
                fold_mem_mb=-(-JOB_SIZING.mem_mb_per_gpu * max(1, SLURM["gpus_per_node"]) // shard_nodes),
                device=config["model"]["device"],
                fold_partition=slurm_resources("fold").get("slurm_partition", ""),
            )
        except FoldmillError as error:
            raise WorkflowError(str(error)) from None


def report_slurm_failures():
    """On Slurm, at the end of a run: each job of this run that did not complete (retried ones
    too), with why, from the accounting database (sacct: state, exit code or signal, memory used
    of memory asked). Nothing where the cluster keeps no accounting. Called by the Snakefile's
    onsuccess and onerror."""
    if workflow.executor_plugin is None or workflow.executor_plugin.name != "slurm":
        return
    from snakemake.logging import logger

    log_dir = Path(getattr(workflow.executor_settings, "logdir", None) or ".snakemake/slurm_logs")
    if not log_dir.is_absolute():
        log_dir = Path(workflow.workdir_init) / log_dir
    jobs = jobs_from_logs(log_dir, RUN_STARTED)
    lines = failure_lines(query_jobs(jobs), jobs)
    if lines:
        logger.warning("Slurm jobs of this run that did not complete (sacct):\n" + "\n".join(f"    {line}" for line in lines))
