"""The workflow on a real Slurm cluster: scripts/slurm/start.sh starts munged, slurmctld and two
slurmd (two virtual nodes with two fake GPUs each) on this machine; every daemon it started is
stopped at the end, also when a test fails.

Covered: the demo workflow through `snakemake --profile profiles/slurm` and the Slurm executor
plugin (GPU jobs asking for fake GPUs while the demo model runs on CPU), its outputs, the Slurm
jobs it submitted, a failed job retried with more memory, a rerun that does nothing, and a Ray
cluster started across the two nodes of one allocation (foldmill.runtime.ray_slurm)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import gemmi
import pandas as pd
import pytest
import yte

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
NODES = 2
# How the workflow test shapes the run: 3 small demo proteins in 2 shards (2 GPU jobs); the
# `shards` job gets 2000 MB on attempt 1 and fails as if out of memory below 3000 MB.
TEST_CONFIG = """\
outdir: results
inputs: [proteins.fasta]
sharding: {tokens_per_shard: 60}
model: {checkpoint: demo, device: cpu, recipe: {recycling_steps: 0, sampling_steps: 2, diffusion_samples: 1}}
msa: {threads: 1}
templates: {threads: 1}
export: {tar_gz: true}
slurm: {mem_mb_per_gpu: 2000, mem_mb_per_token: 1, startup_minutes: 5, simulate_oom_below_mem_mb: 3000}
"""


@dataclass
class Cluster:
    state_dir: Path
    env: dict[str, str]  # environment for Slurm commands and Snakemake

    def run(self, *command: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout, **kwargs)

    def jobs(self) -> list[dict[str, str]]:
        """Every job slurmctld remembers (finished ones too: MinJobAge is an hour), as key=value fields."""
        listing = self.run("scontrol", "-o", "-d", "show", "job").stdout
        return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in listing.splitlines() if line.startswith("JobId=")]

    def wait_for(self, job_id: str, timeout: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = next(job for job in self.jobs() if job["JobId"] == job_id)
            if job["JobState"] not in {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING"}:
                return job
            time.sleep(1)
        raise AssertionError(f"Slurm job {job_id} did not finish within {timeout:.0f} s")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _daemon_pids(state_dir: Path) -> dict[str, int]:
    return {path.stem: int(path.read_text()) for path in (state_dir / "run").glob("*.pid") if path.read_text().strip()}


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.fixture(scope="module")
def slurm_cluster():
    if os.geteuid() != 0:
        pytest.skip("starting slurmd and munged needs root (CI runs as root)")
    if not shutil.which("slurmctld"):
        pytest.fail("Slurm is not installed: scripts/setup.sh installs scripts/apt-packages.txt")
    # Under /tmp, world-traversable: slurmctld runs as the slurm user.
    state_dir = Path(tempfile.mkdtemp(prefix="foldmill-slurm-", dir="/tmp"))
    state_dir.chmod(0o755)
    env = {
        **os.environ,
        "FOLDMILL_SLURM_NODES": str(NODES),
        "FOLDMILL_SLURM_PORT": str(_free_port()),
        "SLURM_CONF": str(state_dir / "etc/slurm.conf"),
        # Profile knobs for this tiny cluster (profiles/README.md): setting an account stops the
        # plugin from guessing one through sacct; the nodes have 2 CPUs each.
        "FOLDMILL_SLURM_ACCOUNT": "foldmill-ci",
        "FOLDMILL_CPUS_PER_GPU": "1",
    }
    cluster = Cluster(state_dir, env)
    try:
        started = cluster.run(str(REPO / "scripts/slurm/start.sh"), str(state_dir), timeout=120)
        assert started.returncode == 0, started.stdout + started.stderr
        yield cluster
    finally:
        pids = _daemon_pids(state_dir)
        stopped = cluster.run(str(REPO / "scripts/slurm/stop.sh"), str(state_dir), timeout=120)
        survivors = {name: pid for name, pid in pids.items() if _running(pid)}
        shutil.rmtree(state_dir, ignore_errors=True)
        assert stopped.returncode == 0 and not survivors, f"{stopped.stdout}{stopped.stderr} still running: {survivors}"


RAY_PROBE = """\
import json, os, sys
import ray
from foldmill.runtime.ray_slurm import ray_for_job

with ray_for_job(None, start_timeout_s=240) as address:
    ray.init(address=address)

    @ray.remote(num_cpus=1)
    def where():
        return os.environ["SLURMD_NODENAME"]

    nodes = [node for node in ray.nodes() if node["Alive"]]
    pinned = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
    ran_on = ray.get([where.options(scheduling_strategy=pinned(n["NodeID"], soft=False)).remote() for n in nodes])
    # What a plain ray.init() on this node would join (another job's local instance must not join this one).
    recorded = "/tmp/ray/ray_current_cluster"
    latest = open(recorded).read().strip() if os.path.exists(recorded) else None
    report = {
        "address": address,
        "ran_on": sorted(ran_on),
        "gpus": [n["Resources"].get("GPU", 0) for n in nodes],
        "plain_init_would_join": latest,
    }
    ray.shutdown()
with open(sys.argv[1], "w") as out:
    json.dump(report, out)
"""


@pytest.fixture(scope="module")
def ray_probe(slurm_cluster, tmp_path_factory):
    """A 2-node Slurm job whose step starts Ray across the allocation, submitted without waiting
    for it (the workflow test requests it too, so both run at once on this small machine)."""
    workdir = tmp_path_factory.mktemp("ray_probe")
    (workdir / "probe.py").write_text(RAY_PROBE)
    # Like the Snakemake Slurm plugin: one task on the first node, in a step of its own.
    (workdir / "job.sh").write_text(
        f"#!/bin/sh\nexec srun --ntasks=1 --nodes={NODES} {sys.executable} {workdir / 'probe.py'} {workdir / 'report.json'}\n"
    )
    submitted = slurm_cluster.run(
        "sbatch", "--parsable", f"--nodes={NODES}", "--partition=gpu", "--gres=gpu:1", "--cpus-per-task=1",
        "--time=10", f"--output={workdir / 'job.log'}", str(workdir / "job.sh"),
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip(), workdir


def _set_resources_with_gpu_fold(env: dict[str, str]) -> list[str]:
    """The profile's set-resources plus fold:gpu=1 (on the command line they replace the profile's).

    rules/fold.smk asks for no GPU with model.device cpu; the CI cluster's point is to run the
    GPU jobs as GPU jobs, so the demo's CPU model still gets its fake GPU.
    """
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        with open(REPO / "profiles/slurm/config.yaml") as stream:
            profile = yte.process_yaml(stream, require_use_yte=True)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    rules = {rule: dict(values) for rule, values in profile["set-resources"].items()}
    rules["fold"]["gpu"] = 1
    return ["--set-resources", *(f"{rule}:{key}={value}" for rule, values in rules.items() for key, value in values.items())]


def _snakemake(cluster: Cluster, workdir: Path) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "snakemake",
        "-s", str(REPO / "Snakefile"),
        "--directory", str(workdir),
        "--configfile", str(workdir / "config.yaml"),
        "--profile", str(REPO / "profiles/slurm"),
        # A small test cluster answers fast: poll sooner than the plugin's default 40 s.
        "--slurm-init-seconds-before-status-checks", "5",
        *_set_resources_with_gpu_fold(cluster.env),
    ]  # fmt: skip
    return cluster.run(*command, timeout=600)


def _describe(jobs: list[dict[str, str]], workdir: Path) -> str:
    """The jobs of a run, and the end of the Slurm log of each that did not complete (for failures)."""
    lines = []
    for job in sorted(jobs, key=lambda job: int(job["JobId"])):
        lines.append(f"{job['JobId']} {job['Comment']} {job['JobState']} {job['MinMemoryNode']}")
        if job["JobState"] != "COMPLETED":
            for log in (workdir / ".snakemake/slurm_logs").glob(f"**/{job['JobId']}.log"):
                lines.append(log.read_text()[-1500:])
    return "\n".join(lines)


def _run_id(output: str) -> str:
    return re.search(r"SLURM run ID: (\S+)", output).group(1)


def test_demo_workflow_runs_on_slurm_with_gpu_jobs_retries_and_a_noop_rerun(slurm_cluster, ray_probe, tmp_path):
    records = (REPO / "config/demo/proteome.fasta").read_text().split(">")[1:4]
    (tmp_path / "proteins.fasta").write_text("".join(">" + record for record in records))
    (tmp_path / "config.yaml").write_text(TEST_CONFIG)
    target_ids = [record.split()[0] for record in records]

    first = _snakemake(slurm_cluster, tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr

    # Outputs: every target folded and summarized, mmCIF that gemmi reads, export and report.
    results = tmp_path / "results"
    summary = pd.read_csv(results / "summary.tsv", sep="\t")
    assert sorted(summary["target_id"]) == sorted(target_ids)
    assert set(summary["status"]) == {"ok"}
    for target_id in target_ids:
        model = next((results / "predictions" / target_id).glob("*.cif"))
        assert gemmi.read_structure(str(model))[0].count_atom_sites() > 0
    shard_tables = sorted((results / "fold").glob("shard_*.tsv"))
    assert [p.stem for p in shard_tables] == ["shard_0000", "shard_0001"]
    assert (results / "filter/passed.tsv").exists() and (results / "export.tar.gz").stat().st_size > 0
    assert (results / "report/throughput.png").stat().st_size > 0

    # The Slurm jobs of this run (the plugin names each job after the run id).
    jobs = [job for job in slurm_cluster.jobs() if job["JobName"] == _run_id(first.stdout + first.stderr)]
    by_rule = Counter(re.sub(r"_wildcards_.*", "", job["Comment"]) for job in jobs)
    assert by_rule == {
        "rule_worklist": 1,
        "rule_stage_msas": 1,
        "rule_stage_templates": 1,
        "rule_shards": 2,  # attempt 1 failed, attempt 2 succeeded
        "rule_fold": 2,  # one GPU job per shard
        "rule_outputs_export_export_archive_filter_report_figures_summary": 1,  # one grouped job
    }, _describe(jobs, tmp_path)
    shards_attempts = sorted((job for job in jobs if job["Comment"] == "rule_shards"), key=lambda job: int(job["JobId"]))
    assert [(job["JobState"], job["MinMemoryNode"]) for job in shards_attempts] == [
        ("FAILED", "2000M"),  # simulated out-of-memory below 3000 MB
        ("COMPLETED", "4000M"),  # resubmitted with twice the memory
    ]
    failed_log = tmp_path / f".snakemake/slurm_logs/rule_shards/{shards_attempts[0]['JobId']}.log"
    assert "simulated out-of-memory: granted 2000 MB, needs 3000 MB" in failed_log.read_text()
    folds = [job for job in jobs if job["Comment"].startswith("rule_fold")]
    for job in folds:  # asked for a GPU, and got one of the fake ones
        assert (job["Partition"], job["TresPerJob"], job["JOB_GRES"]) == ("gpu", "gres:gpu:1", "gpu:1"), job
    others = [job for job in jobs if job not in shards_attempts[:1]]
    assert {job["JobState"] for job in others} == {"COMPLETED"}

    # A rerun finds everything done and submits nothing.
    job_count = len(slurm_cluster.jobs())
    second = _snakemake(slurm_cluster, tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "Nothing to be done" in second.stdout + second.stderr
    assert len(slurm_cluster.jobs()) == job_count


def test_ray_cluster_spans_both_nodes_of_an_allocation_and_is_stopped(slurm_cluster, ray_probe):
    job_id, workdir = ray_probe
    job = slurm_cluster.wait_for(job_id, timeout=300)
    log = (workdir / "job.log").read_text()
    assert job["JobState"] == "COMPLETED", log[-3000:]

    report = json.loads((workdir / "report.json").read_text())
    assert report["ran_on"] == [f"{socket.gethostname().split('.')[0]}-{n}" for n in range(1, NODES + 1)], log[-3000:]
    assert report["gpus"] == [1.0] * NODES  # each node's GRES GPU, as Ray sees it
    assert report["plain_init_would_join"] != report["address"]
    # Torn down: no Ray process of that cluster is left on this machine.
    port = report["address"].rsplit(":", 1)[1]
    leftovers = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f":{port}" in text and "ray" in text:
            leftovers.append(text[:200])
    assert not leftovers, leftovers
