"""The workflow on a real Slurm cluster: scripts/slurm/start.sh starts munged, MariaDB, slurmdbd,
slurmctld and two slurmd (two virtual nodes with two fake GPUs each) on this machine; every daemon
it started is stopped at the end, also when a test fails.

Covered: the cluster user's walkthrough of profiles/README.md, its commands run as written (and
README.md's): a job no node can run and a corrupt checkpoint each stop the run in one line before
any staging job, the dry run, the real run through fold, summary and export with a job that Slurm
kills for memory, retried with more and reported with sacct's reason, the config's partition,
account, QoS, constraint and extra sbatch options reaching sbatch with a command-line
--set-resources adding to them, CPUs consistent from sbatch to the job step, per-target job lines
in the summary, and a rerun that does nothing; a config of MoE pretraining alone, refused in one
line where its pretrain job fits no node, then run; and a Ray cluster started across the two nodes
of one allocation (foldmill.runtime.ray_slurm).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import gemmi
import pandas as pd
import pytest
import yaml

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
NODES = 2
NODE_NAMES = rf"{re.escape(socket.gethostname().split('.')[0])}-[1-{NODES}]"
# The walkthrough's my_proteome.yaml for this cluster (nodes of 2 CPUs, no real GPU): 3 small demo
# proteins in 2 shards, the demo model on CPU with a short recipe; its `slurm:` line is added from
# profiles/README.md (walkthrough_slurm), with a node feature and an extra sbatch option. Fold jobs
# ask 4 GB: their Ray processes hold ~2.1 GB of RSS together, and Slurm kills a job above its memory.
TEST_CONFIG = """\
inputs: [proteins.fasta]
sharding: {tokens_per_shard: 60}
model: {checkpoint: demo, device: cpu, recipe: {recycling_steps: 0, sampling_steps: 2, diffusion_samples: 1}}
msa: {threads: 1}
templates: {threads: 1}
export: {tar_gz: true}
slurm: {cpus_per_gpu: 1, mem_mb_per_gpu: 4000, mem_mb_per_token: 1, startup_minutes: 5,
        fold: {constraint: fakegpu}, msa: {extra: --nice=7}}
moe: {enabled: false}
"""
# Workflow files a user's checkout has; the walkthrough runs in a directory linking to them.
CHECKOUT = ("Snakefile", "rules", "workflow", "envs", "config", "profiles", "src")


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
        # This cluster's jobs take seconds: check their states every 10 s, not 40 s.
        "FOLDMILL_SLURM_POLL_SECONDS": "10",
        "SLURM_CONF": str(state_dir / "etc/slurm.conf"),
    }
    # The profile's settings are its defaults (status command auto: sacct, accounting answers here).
    for name in [name for name in env if name.startswith("FOLDMILL_") and not name.startswith("FOLDMILL_SLURM_")]:
        del env[name]
    env.pop("FOLDMILL_SLURM_STATUS_COMMAND", None)
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


def walkthrough_slurm() -> dict:
    """The `slurm:` line of the walkthrough's my_proteome.yaml (profiles/README.md)."""
    walkthrough = (REPO / "profiles/README.md").read_text().split("## Walkthrough", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", walkthrough, flags=re.DOTALL).group(1)
    return yaml.safe_load(textwrap.dedent(block))["slurm"]


def walkthrough_config(**changes: str) -> str:
    """TEST_CONFIG with the walkthrough's `slurm:` settings under its own, `changes` replacing text."""
    text = TEST_CONFIG
    for old, new in changes.items():
        text = text.replace(old, new)
    config = yaml.safe_load(text)
    slurm = walkthrough_slurm()
    for key, value in config["slurm"].items():
        slurm[key] = {**slurm.get(key, {}), **value} if isinstance(value, dict) else value
    return yaml.safe_dump({**config, "slurm": slurm})


def documented_commands() -> tuple[list[str], list[str]]:
    """The `export` lines of profiles/README.md and every Slurm-profile snakemake command line of
    README.md and profiles/README.md, as written (from their ```bash blocks, comments dropped)."""
    exports, commands = [], []
    for doc in ("README.md", "profiles/README.md"):
        for block in re.findall(r"```bash\n(.*?)```", (REPO / doc).read_text(), flags=re.DOTALL):
            for line in block.splitlines():
                line = line.split(" # ")[0].strip()
                if line.startswith("export ") and doc == "profiles/README.md":
                    exports.append(line)
                elif "snakemake --profile profiles/slurm" in line and line not in commands:
                    commands.append(line)
    return exports, commands


def _checkout(workdir: Path) -> None:
    """Make `workdir` look like the foldmill checkout the documents' commands run in."""
    for name in CHECKOUT:
        (workdir / name).symlink_to(REPO / name)
    (workdir / ".venv").symlink_to(Path(sys.executable).parents[1])


def _run_documented(cluster: Cluster, workdir: Path, command: str, **environ: str) -> subprocess.CompletedProcess:
    """A documented command line, after the walkthrough's export lines, in bash in `workdir`."""
    exports, _ = documented_commands()
    env = {**cluster.env, "PATH": f"{Path(sys.executable).parent}:{cluster.env['PATH']}", **environ}
    script = "\n".join([*exports, command])
    return subprocess.run(["bash", "-ec", script], cwd=workdir, env=env, capture_output=True, text=True, timeout=600)


def _describe(jobs: list[dict[str, str]], workdir: Path) -> str:
    """The jobs of a run, and the end of the Slurm log of each that did not complete (for failures)."""
    lines = []
    for job in sorted(jobs, key=lambda job: int(job["JobId"])):
        lines.append(f"{job['JobId']} {job['Comment']} {job['JobState']} {job['MinMemoryNode']}")
        if job["JobState"] != "COMPLETED":
            for log in (workdir / ".snakemake/slurm_logs").glob(f"**/{job['JobId']}.log"):
                lines.append(log.read_text()[-1500:])
    return "\n".join(lines)


def _run_jobs(cluster: Cluster, output: str) -> list[dict[str, str]]:
    """The Slurm jobs of one Snakemake run (the plugin names each job after the run id)."""
    found = re.search(r"SLURM run ID: (\S+)", output)
    return [job for job in cluster.jobs() if found and job["JobName"] == found.group(1)]


def _rule(job: dict[str, str]) -> str:
    return re.sub(r"^rule_|_wildcards_.*", "", job["Comment"])


def test_documented_walkthrough_runs_on_slurm_fails_fast_retries_and_reruns(slurm_cluster, ray_probe, tmp_path):
    exports, commands = documented_commands()
    dry_run = "snakemake --profile profiles/slurm --configfile my_proteome.yaml -n"
    run = "snakemake --profile profiles/slurm --configfile my_proteome.yaml"
    run_high = run + " --set-resources fold:qos=high"  # one setting for one run, added to the config's
    rerun = ".venv/bin/snakemake --profile profiles/slurm --configfile my_proteome.yaml"  # README.md's
    assert sorted(commands) == sorted([dry_run, run, run_high, rerun]), "a documented command this test does not run"
    assert exports == []  # everything cluster-specific is in my_proteome.yaml
    assert walkthrough_slurm() == {"account": "mylab", "qos": "normal", "partition": "cpu", "fold": {"partition": "gpu"}}
    _checkout(tmp_path)
    records = (REPO / "config/demo/proteome.fasta").read_text().split(">")[1:4]
    (tmp_path / "proteins.fasta").write_text("".join(">" + record for record in records))
    target_ids = [record.split()[0] for record in records]
    config = tmp_path / "my_proteome.yaml"
    jobs_before = len(slurm_cluster.jobs())

    # A job no node can run (msa.threads defaults to 8 CPUs; the nodes have 2): one line, nothing queued.
    config.write_text(walkthrough_config(**{"msa: {threads: 1}\n": ""}))
    too_big = _run_documented(slurm_cluster, tmp_path, run)
    assert too_big.returncode == 1, too_big.stdout + too_big.stderr
    assert (
        "stage_msas: asks 8 CPUs per node (largest node: 2) in partition 'cpu': it would stay PENDING "
        "forever; lower msa.threads or pick another partition"
    ) in too_big.stderr
    assert len(slurm_cluster.jobs()) == jobs_before

    # A corrupt checkpoint fails the local check_model once, in one line, before any staging job.
    (tmp_path / "boltz2_conf.ckpt").write_bytes(b"not a checkpoint")
    config.write_text(walkthrough_config(**{"checkpoint: demo": "checkpoint: boltz2_conf.ckpt"}))
    bad_model = _run_documented(slurm_cluster, tmp_path, run)
    output = bad_model.stdout + bad_model.stderr
    assert bad_model.returncode == 1, output
    assert "foldmill: error: boltz2_conf.ckpt: not a PyTorch zip-format weights file" in output
    assert output.count("Error in rule check_model") == 1 and "Trying to restart" not in output
    assert {_rule(job) for job in _run_jobs(slurm_cluster, output)} <= {"worklist"}

    # The fixed config: dry run, then the real run with the fold jobs at QoS high (the shards job is
    # killed by Slurm for memory on its first attempt).
    config.write_text(walkthrough_config())
    planned = _run_documented(slurm_cluster, tmp_path, dry_run)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert re.search(r"^fold\s", planned.stdout, flags=re.MULTILINE) is None  # fold jobs exist once shards ran
    assert re.search(r"^stage_msas\s+1$", planned.stdout, flags=re.MULTILINE), planned.stdout
    first = _run_documented(slurm_cluster, tmp_path, run_high, FOLDMILL_TEST_OOM_BELOW_MB="3000")
    output = first.stdout + first.stderr
    assert first.returncode == 0, output

    # Outputs: every target folded and summarized, mmCIF that gemmi reads, export and report.
    results = tmp_path / "results"
    summary = pd.read_csv(results / "summary.tsv", sep="\t")
    assert sorted(summary["target_id"]) == sorted(target_ids)
    assert set(summary["status"]) == {"ok"}
    for target_id in target_ids:
        model = next((results / "predictions" / target_id).glob("*.cif"))
        assert gemmi.read_structure(str(model))[0].count_atom_sites() > 0
    assert [p.stem for p in sorted((results / "fold").glob("shard_*.tsv"))] == ["shard_0000", "shard_0001"]
    assert (results / "filter/passed.tsv").exists() and (results / "export.tar.gz").stat().st_size > 0
    assert (results / "report/throughput.png").stat().st_size > 0

    jobs = _run_jobs(slurm_cluster, output)
    assert Counter(_rule(job) for job in jobs) == {  # the worklist job of the failed run above is kept
        "stage_msas": 1, "stage_templates": 1,
        "shards": 2,  # attempt 1 died for memory, attempt 2 succeeded
        "fold": 2,  # one job per shard
        "summary": 1, "filter": 1, "export": 1, "export_archive": 1, "report_figures": 1, "report": 1,
    }, _describe(jobs, tmp_path)  # fmt: skip
    shards_attempts = sorted((job for job in jobs if _rule(job) == "shards"), key=lambda job: int(job["JobId"]))
    assert [(job["JobState"], job["MinMemoryNode"]) for job in shards_attempts] == [
        ("FAILED", "2000M"),  # simulated out-of-memory below 3000 MB
        ("COMPLETED", "4000M"),  # resubmitted with twice the memory
    ]
    failed_log = tmp_path / f".snakemake/slurm_logs/rule_shards/{shards_attempts[0]['JobId']}.log"
    assert "exceeded memory limit" in failed_log.read_text()
    # Job states came from sacct (accounting answers), and the run ends with sacct's reason.
    assert "Detailed failure reason unavailable" not in output
    assert "Slurm jobs of this run that did not complete (sacct):" in output
    assert re.search(
        rf"Slurm job {shards_attempts[0]['JobId']} \(rule shards\) on {NODE_NAMES}: FAILED, killed by signal 9, "
        r"used \d+ MB of 2000 MB memory, out of memory", output
    ), output[-3000:]
    # Fold jobs got the CPUs the config asks for (slurm.cpus_per_gpu: 1), and their job step (srun
    # with the rule's threads) ran in them; staging jobs got msa.threads / templates.threads.
    assert {job["NumCPUs"] for job in jobs} == {"1"}
    # Where jobs ran, from the config's slurm: section, with the command line's QoS for fold added.
    fold_jobs = [job for job in jobs if _rule(job) == "fold"]
    assert {(job["Partition"], job["QOS"], job["Features"]) for job in fold_jobs} == {("gpu", "high", "fakegpu")}
    others = [job for job in jobs if _rule(job) != "fold"]
    assert {(job["Partition"], job["QOS"], job["Features"]) for job in others} == {("cpu", "normal", "(null)")}
    assert {job["Account"] for job in jobs} == {"mylab"}
    assert {(_rule(job), job["Nice"]) for job in jobs if job["Nice"] != "0"} == {("stage_msas", "7")}
    accounted = slurm_cluster.run("sacct", "-X", "-n", "-P", "-o", "JobIDRaw,Partition,QOS,Account", "-j",
                                  ",".join(job["JobId"] for job in fold_jobs))  # fmt: skip
    assert sorted(accounted.stdout.split()) == sorted(f"{job['JobId']}|gpu|high|mylab" for job in fold_jobs)
    assert {job["JobState"] for job in jobs if job is not shards_attempts[0]} == {"COMPLETED"}
    # Visibility: Slurm's log of every job is kept, successful ones too, and each target has a line
    # saying which shard, job and node folded it.
    for job in jobs:
        assert list((tmp_path / ".snakemake/slurm_logs").glob(f"**/{job['JobId']}.log")), job
    per_target = pd.concat(pd.read_csv(path, sep="\t", dtype=str) for path in (results / "logs/fold").glob("*.jobs.tsv"))
    assert sorted(per_target["target_id"]) == sorted(target_ids) and set(per_target["status"]) == {"ok"}
    fold_by_id = {job["JobId"]: job for job in fold_jobs}
    for row in per_target.itertuples():
        assert fold_by_id[row.job_id]["Comment"].endswith(row.shard) and fold_by_id[row.job_id]["NodeList"] == row.node
    # ... and the summary holds the same lines.
    in_summary = summary.set_index("target_id")[["shard", "job_id", "node"]].astype(str)
    assert in_summary.to_dict("index") == per_target.set_index("target_id")[["shard", "job_id", "node"]].to_dict("index")

    # README.md's command: a rerun finds everything done and submits nothing.
    job_count = len(slurm_cluster.jobs())
    second = _run_documented(slurm_cluster, tmp_path, rerun)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "Nothing to be done" in second.stdout + second.stderr
    assert len(slurm_cluster.jobs()) == job_count


def test_pretraining_alone_runs_on_slurm(slurm_cluster, tmp_path):
    """A config with a corpus and no inputs, run with the Slurm profile: a pretrain job no node can
    run stops in one line with nothing queued; the fitting one runs the three MoE jobs and nothing
    of folding."""
    _checkout(tmp_path)
    config = tmp_path / "my_pretrain.yaml"
    run = "snakemake --profile profiles/slurm --configfile my_pretrain.yaml"
    settings = ("slurm: {partition: cpu, pretrain: {partition: cpu}}\n"
                "moe: {enabled: true, corpus: [config/demo/yeast_chr1.fasta], model: tiny, steps: 2, batch_size: 2,\n"
                "      seq_len: 64, precision: fp32, gpus: 0, cpus_per_gpu: CPUS, mem_mb: 2000, runtime_minutes: 10,\n"
                "      eval_batches: 2}\n")
    jobs_before = len(slurm_cluster.jobs())
    config.write_text(settings.replace("CPUS", "8"))
    too_big = _run_documented(slurm_cluster, tmp_path, run)
    assert too_big.returncode == 1, too_big.stdout + too_big.stderr
    assert ("moe_pretrain: asks 8 CPUs per node (largest node: 2) in partition 'cpu': it would stay PENDING "
            "forever; lower moe.cpus_per_gpu, moe.gpus or moe.mem_mb") in too_big.stderr
    assert len(slurm_cluster.jobs()) == jobs_before

    config.write_text(settings.replace("CPUS", "1"))
    done = _run_documented(slurm_cluster, tmp_path, run)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "foldmill: no inputs, so no folding; MoE pretraining on; outdir results" in output
    assert json.loads((tmp_path / "results/moe/evaluation.json").read_text())["step"] == 2
    jobs = _run_jobs(slurm_cluster, output)
    assert Counter(_rule(job) for job in jobs) == {"moe_prepare_corpus": 1, "moe_pretrain": 1, "moe_evaluate": 1}
    assert {job["JobState"] for job in jobs} == {"COMPLETED"}


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
