# Checks that fail a run in seconds, before any staging or GPU job is queued:
# - rule check_model (rules/fold.smk; local, no queue wait): the checkpoint exists, loads through
#   the safe loader and has the keys and shapes of a Boltz-2 model. Staging and sharding wait for
#   its output MODEL_CHECK.
# - on Slurm, before the first submission: every job fits a node of its partition (CPUs, memory,
#   GPUs; Slurm would leave it PENDING forever) and model.device cuda comes with GPUs.
from snakemake.exceptions import WorkflowError

from foldmill.errors import FoldmillError
from foldmill.runtime.slurm_plan import check_jobs, check_plan

MODEL_CHECK = OUTDIR / "checks/model.txt"
