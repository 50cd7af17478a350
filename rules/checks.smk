# Checks that fail a run in seconds, before any staging or GPU job is queued:
# - check_model (a local rule, no queue wait): the checkpoint exists, loads through the safe
#   loader and has the keys and shapes of a Boltz-2 model. Staging and sharding wait for it.
# - on Slurm, before the first submission: every job fits a node of its partition (CPUs, memory,
#   GPUs; Slurm would leave it PENDING forever) and model.device cuda comes with GPUs.
from snakemake.exceptions import WorkflowError

from foldmill.errors import FoldmillError
from foldmill.runtime.slurm_fit import DEFAULT_PARTITION, JobRequest, check_requests, count_gpus

MODEL_CHECK = OUTDIR / "checks/model.txt"
# Settings to lower when a rule's job does not fit (the rest come from the profile's default-resources).
SLURM_KNOBS = {
    "stage_msas": "msa.threads",
    "stage_templates": "templates.threads",
    "fold": "slurm.cpus_per_gpu, slurm.gpus_per_node or slurm.mem_mb_per_gpu",
    "moe_pretrain": "moe.cpus_per_gpu, moe.gpus or moe.mem_mb",
    "moe_evaluate": "moe.gpus or moe.mem_mb",
}


def model_checkpoint_input(wildcards):
    path = config["model"]["checkpoint"]
    return [] if path == "demo" else [path]


rule check_model:
    input:
        checkpoint=model_checkpoint_input,
    output:
        MODEL_CHECK,
    params:
        checkpoint=config["model"]["checkpoint"],
    localrule: True
    retries: 0  # a bad checkpoint stays bad
    log:
        LOGDIR / "check_model.log",
    conda:
        env_path("foldmill.yaml")
    script:
        script_path("check_model.py")


def _job_request(job):
    """What a planned Snakemake job will ask Slurm for, per node."""
    resources = job.resources
    gpus = resources.get("gpu") or count_gpus(resources.get("gres") or "")
    cpus = resources.get("cpus_per_task") or (resources.get("cpus_per_gpu") or 0) * gpus or job.threads
    mem_mb = resources.get("mem_mb")
    return JobRequest(
        name=job.rule.name,
        partition=resources.get("slurm_partition") or DEFAULT_PARTITION,
        cpus=int(cpus),
        mem_mb=mem_mb if isinstance(mem_mb, int) else 0,
        gpus=int(gpus),
        knobs=SLURM_KNOBS.get(job.rule.name, "the profile's default-resources"),
    )


def _profile_resource(rule_name, name):
    """A resource the profile (or --set-resources) gives a rule, or None."""
    rule_resources = workflow.resource_settings.overwrite_resources.get(rule_name) or {}
    value = rule_resources.get(name)
    if hasattr(value, "evaluate"):  # an expression, evaluated as Snakemake would for a first attempt
        value = value.evaluate({}, input=[], attempt=1, threads=1, rulename=rule_name, async_run=workflow.async_run).value
    return value


def _fold_request():
    """A fold job's request before the shards exist: its CPUs and GPUs are fixed by the config,
    its memory is at least the per-GPU base."""
    return JobRequest(
        name="fold",
        partition=_profile_resource("fold", "slurm_partition") or DEFAULT_PARTITION,
        cpus=FOLD_CPUS,
        mem_mb=-(-JOB_SIZING.mem_mb_per_gpu * max(1, SLURM["gpus_per_node"]) // shard_nodes),
        gpus=SLURM["gpus_per_node"] if FOLD_ON_GPU else 0,
        knobs=SLURM_KNOBS["fold"],
    )


def check_slurm_plan():
    """Raise a one-line WorkflowError when a planned job can never start on this Slurm cluster."""
    if FOLD_ON_GPU and SLURM["gpus_per_node"] == 0:
        raise WorkflowError("model.device is cuda but slurm.gpus_per_node is 0: fold jobs would get no GPU")
    jobs = [job for job in workflow.dag.needrun_jobs() if not job.is_group() and not job.is_local]
    requests = [_job_request(job) for job in jobs]
    if {"shards", "fold"} & {job.rule.name for job in jobs}:
        requests.append(_fold_request())
    try:
        check_requests(requests)
    except FoldmillError as error:
        raise WorkflowError(str(error)) from None


onstart:
    if workflow.executor_plugin is not None and workflow.executor_plugin.name == "slurm":
        check_slurm_plan()
