# Checks that fail a run in seconds, before any staging or GPU job is queued:
# - rule check_model (rules/fold.smk; local, no queue wait): the checkpoint exists, loads through
#   the safe loader and has the keys and shapes of a Boltz-2 model. Staging and sharding wait for
#   its output MODEL_CHECK.
# - on Slurm, before the first submission: every job fits a node of its partition (CPUs, memory,
#   GPUs; Slurm would leave it PENDING forever) and model.device cuda comes with GPUs.
from snakemake.exceptions import WorkflowError

from foldmill.errors import FoldmillError
from foldmill.runtime.slurm_plan import check_plan

MODEL_CHECK = OUTDIR / "checks/model.txt"


def check_slurm_plan():
    """Called by the Snakefile's onstart (Snakemake keeps only one onstart handler)."""
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
