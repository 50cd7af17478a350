"""The Slurm check of a planned Snakemake run (rules/checks.smk calls `check_plan` on start).

Turns each planned job into the per-node request the Slurm plugin will submit (foldmill.runtime.
slurm_fit checks it against the cluster). Fold jobs do not exist before the `shards` checkpoint
ran, so their request is built from the config: CPUs and GPUs are fixed, memory is at least the
per-GPU base.
"""

from __future__ import annotations

from typing import Any

from foldmill.errors import FoldmillError
from foldmill.runtime.slurm_fit import DEFAULT_PARTITION, JobRequest, check_requests, count_gpus

# Settings to lower when a rule's job does not fit (the rest come from the profile's default-resources).
SLURM_KNOBS = {
    "stage_msas": "msa.threads",
    "stage_templates": "templates.threads",
    "fold": "slurm.cpus_per_gpu, slurm.gpus_per_node or slurm.mem_mb_per_gpu",
    "moe_pretrain": "moe.cpus_per_gpu, moe.gpus or moe.mem_mb",
    "moe_evaluate": "moe.gpus or moe.mem_mb",
}


def job_request(job: Any) -> JobRequest:
    """What a planned Snakemake job will ask Slurm for, per node (as the Slurm plugin computes it)."""
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


def profile_resource(workflow: Any, rule: str, name: str) -> Any:
    """A resource --set-resources (command line or profile) gives a rule, or None."""
    value = (workflow.resource_settings.overwrite_resources.get(rule) or {}).get(name)
    if hasattr(value, "evaluate"):  # an expression, evaluated as Snakemake would for a first attempt
        value = value.evaluate({}, input=[], attempt=1, threads=1, rulename=rule, async_run=workflow.async_run).value
    return value


def check_plan(workflow: Any, fold_cpus: int, fold_gpus: int, fold_mem_mb: int, device: str,
               fold_partition: str = "") -> None:
    """Raise a one-line FoldmillError when a planned job can never start on this Slurm cluster.
    `fold_partition`: the config's (slurm.fold.partition), unless --set-resources gives another."""
    if device == "cuda" and fold_gpus == 0:
        raise FoldmillError("model.device is cuda but slurm.gpus_per_node is 0: fold jobs would get no GPU")
    jobs = planned_jobs(workflow)
    requests = [job_request(job) for job in jobs]
    if {"shards", "fold"} & {job.rule.name for job in jobs}:
        partition = profile_resource(workflow, "fold", "slurm_partition") or fold_partition or DEFAULT_PARTITION
        requests.append(JobRequest("fold", partition, fold_cpus, fold_mem_mb, fold_gpus, SLURM_KNOBS["fold"]))
    check_requests(requests)


def check_jobs(workflow: Any) -> None:
    """check_plan for a run that folds nothing (MoE pretraining alone): its planned jobs only."""
    check_requests([job_request(job) for job in planned_jobs(workflow)])


def planned_jobs(workflow: Any) -> list[Any]:
    """The jobs of the run that Slurm will be asked for."""
    return [job for job in workflow.dag.needrun_jobs() if not job.is_group() and not job.is_local]
