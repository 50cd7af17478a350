"""Ray on Slurm without a cluster: which Ray a fold job uses, and how workers are launched.
(The real 2-node start and teardown runs in tests/test_slurm_cluster.py.)"""

from __future__ import annotations

import sys

from foldmill.runtime.ray_slurm import Allocation, ray_for_job, step_environment, worker_command


def test_a_standing_cluster_is_joined_untouched(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[01-04]")  # never expanded: nothing is started
    with ray_for_job("head.cluster:6379") as address:
        assert address == "head.cluster:6379"


def test_outside_slurm_the_executor_starts_its_own_local_ray(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    with ray_for_job(None) as address:
        assert address is None


def test_workers_start_on_every_other_node_inside_the_allocation():
    allocation = Allocation("123", ("gpu01", "gpu02", "gpu03"), "gpu01", cpus_per_node=32, gpus_per_node=4)
    command = worker_command(allocation, "10.0.0.1:6379", "/tmp/ray-123-6379")
    srun, worker = command[: command.index(sys.executable)], command[command.index(sys.executable) :]
    assert srun[0] == "srun"
    assert {"--jobid=123", "--overlap", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1"} <= set(srun)
    assert {"--nodelist=gpu02,gpu03", "--cpus-per-task=32", "--gres=gpu:4"} <= set(srun)
    assert worker == [sys.executable, "-m", "foldmill.runtime.ray_slurm", "10.0.0.1:6379", "32", "4", "/tmp/ray-123-6379"]


def test_cpu_only_allocations_ask_for_no_gres():
    allocation = Allocation("9", ("cpu1", "cpu2"), "cpu1", cpus_per_node=8, gpus_per_node=0)
    assert not [arg for arg in worker_command(allocation, "h:1", "/tmp/r") if arg.startswith("--gres")]


def test_nested_srun_sees_the_job_but_not_the_step(monkeypatch):
    for name, value in {
        "SLURM_JOB_ID": "123",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_CPUS_PER_TASK": "8",
        "SLURM_GPUS": "4",
        "SRUN_CPUS_PER_TASK": "8",
        "SBATCH_PARTITION": "gpu",
    }.items():
        monkeypatch.setenv(name, value)
    environ = step_environment()
    assert environ["SLURM_JOB_ID"] == "123" and environ["SLURM_CONF"] == "/etc/slurm/slurm.conf"
    dropped = {"SLURM_STEP_ID", "SLURM_NTASKS", "SLURM_CPUS_PER_TASK", "SLURM_GPUS", "SRUN_CPUS_PER_TASK", "SBATCH_PARTITION"}
    assert not dropped & set(environ)
    assert environ["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"
