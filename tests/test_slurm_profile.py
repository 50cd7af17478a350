"""profiles/slurm without a cluster: it renders from the environment, passes --lint, takes where
jobs run from the config (command-line --set-resources adding to it), and plans a 20,000-target
proteome as at most 100 GPU jobs (dry-run)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
import yte

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
PROFILE_ENV = ("FOLDMILL_SLURM_STATUS_COMMAND", "FOLDMILL_KEEP_JOB_LOGS", "FOLDMILL_SLURM_POLL_SECONDS")


def render_profile(monkeypatch: pytest.MonkeyPatch, **environ: str) -> dict:
    for name in PROFILE_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with open(REPO / "profiles/slurm/config.yaml") as stream:
        return yte.process_yaml(stream, require_use_yte=True)


def test_profile_leaves_where_jobs_run_to_the_config(monkeypatch):
    profile = render_profile(monkeypatch, FOLDMILL_SLURM_STATUS_COMMAND="squeue")
    assert profile["executor"] == "slurm"
    assert profile["slurm-status-command"] == "squeue"
    assert profile["slurm-keep-successful-logs"] is True
    assert profile["slurm-init-seconds-before-status-checks"] == 40
    assert render_profile(monkeypatch, FOLDMILL_SLURM_POLL_SECONDS="10")["slurm-init-seconds-before-status-checks"] == 10
    # No set-resources: a command-line --set-resources would replace it whole (partition included).
    assert "set-resources" not in profile
    assert profile["default-resources"] == {"mem_mb": 4000, "runtime": 60}
    assert "groups" not in profile  # a group holding summary (which needs every fold job) makes planning quadratic
    assert render_profile(monkeypatch, FOLDMILL_SLURM_STATUS_COMMAND="sacct")["slurm-status-command"] == "sacct"
    assert render_profile(monkeypatch, FOLDMILL_KEEP_JOB_LOGS="no")["slurm-keep-successful-logs"] is False


def test_status_command_is_sacct_only_where_accounting_answers(monkeypatch):
    from foldmill.runtime import slurm_accounting

    monkeypatch.setattr(slurm_accounting, "accounting_answers", lambda: False)
    assert slurm_accounting.status_command({}) == "squeue"
    monkeypatch.setattr(slurm_accounting, "accounting_answers", lambda: True)
    assert slurm_accounting.status_command({"FOLDMILL_SLURM_STATUS_COMMAND": "auto"}) == "sacct"
    assert slurm_accounting.status_command({"FOLDMILL_SLURM_STATUS_COMMAND": "squeue"}) == "squeue"
    with pytest.raises(ValueError, match="one of auto, sacct, squeue"):
        slurm_accounting.status_command({"FOLDMILL_SLURM_STATUS_COMMAND": "scontrol"})


def test_each_class_of_job_takes_its_own_setting_else_the_common_one():
    from foldmill.config import resolve_config
    from foldmill.runtime.slurm_jobs import slurm_job_resources

    slurm = resolve_config({
        "inputs": ["x.fasta"], "model": {"checkpoint": "demo"},
        "slurm": {"account": "lab42", "qos": "normal", "partition": "short", "gpu_model": "h100",
                  "fold": {"qos": "high", "constraint": "nvlink"}, "msa": {"partition": "bigmem", "extra": "--nice=5"},
                  "pretrain": {"account": "ml"}},
    })["slurm"]  # fmt: skip
    assert slurm_job_resources(slurm) == {"slurm_partition": "short", "slurm_account": "lab42", "qos": "normal"}
    assert slurm_job_resources(slurm, "fold", gpus=4) == {
        "slurm_partition": "gpu", "slurm_account": "lab42", "qos": "high", "constraint": "nvlink", "gpu_model": "h100"
    }  # fmt: skip
    assert "gpu_model" not in slurm_job_resources(slurm, "fold", gpus=0)  # multi-node or CPU fold jobs
    assert slurm_job_resources(slurm, "msa") == {
        "slurm_partition": "bigmem", "slurm_account": "lab42", "qos": "normal", "slurm_extra": "--nice=5"
    }  # fmt: skip
    assert slurm_job_resources(slurm, "templates") == slurm_job_resources(slurm)
    assert slurm_job_resources(slurm, "pretrain") == {"slurm_partition": "gpu", "slurm_account": "ml", "qos": "normal"}
    # Nothing set: no option at all, the cluster's defaults apply (fold and pretraining: partition gpu).
    bare = resolve_config({"inputs": ["x.fasta"], "model": {"checkpoint": "demo"}})["slurm"]
    assert slurm_job_resources(bare) == {} and slurm_job_resources(bare, "fold", gpus=1) == {"slurm_partition": "gpu"}


def test_command_line_set_resources_adds_to_what_the_config_gives(monkeypatch):
    """The documented way to change one value for one run: the rest of the job's settings stay."""
    for name in PROFILE_ENV:
        monkeypatch.delenv(name, raising=False)
    result = subprocess.run(
        [*SNAKEMAKE, "--profile", "profiles/slurm", "-n", "--configfile", "config/demo/config.yaml",
         "--config", "slurm={account: lab42, partition: short, msa: {extra: --nice=5}, pretrain: {constraint: a100}}",
         "--set-resources", "stage_msas:qos=high"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "FOLDMILL_SLURM_STATUS_COMMAND": "squeue"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    resources = dict(re.findall(r"^rule (\w+):.*?resources: ([^\n]*)", result.stdout, flags=re.MULTILINE | re.DOTALL))
    assert {"stage_msas", "worklist", "moe_pretrain"} <= set(resources), result.stdout
    for expected in ("slurm_partition=short", "slurm_account=lab42", "slurm_extra=--nice=5", "qos=high"):
        assert expected in resources["stage_msas"]
    assert "slurm_partition=short" in resources["worklist"] and "slurm_account=lab42" in resources["worklist"]
    assert "qos=" not in resources["worklist"]
    for expected in ("slurm_partition=gpu", "slurm_account=lab42", "constraint=a100"):
        assert expected in resources["moe_pretrain"]


def test_profile_passes_lint():
    result = subprocess.run(
        [*SNAKEMAKE, "--lint", "--profile", "profiles/slurm"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Lints for" not in output, output
    assert "Congratulations, your workflow is in a good condition" in output


def synthetic_proteome(path: Path, count: int, seed: int = 0) -> int:
    """`count` random proteins, log-normal lengths like a real proteome (median ~420); returns the residues."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"ACDEFGHIKLMNPQRSTVWY", dtype=np.uint8)
    lengths = np.clip(rng.lognormal(np.log(420), 0.6, count).astype(int), 30, 5000)
    residues = letters[rng.integers(0, len(letters), int(lengths.sum()))].tobytes().decode()
    ends = np.cumsum(lengths)
    with open(path, "w") as fasta:
        for index, (end, length) in enumerate(zip(ends, lengths)):
            fasta.write(f">SYN{index:05d}\n{residues[end - length:end]}\n")
    return int(lengths.sum())


def job_counts(snakemake_output: str) -> dict[str, int]:
    table = snakemake_output.split("Job stats:", 1)[1].split("total", 1)[0]
    return {name: int(count) for name, count in re.findall(r"^(\w+)\s+(\d+)\s*$", table, flags=re.MULTILINE)}


@pytest.mark.slow
def test_proteome_of_20000_targets_plans_at_most_100_gpu_jobs(tmp_path, monkeypatch):
    residues = synthetic_proteome(tmp_path / "proteome.fasta", 20_000)
    config = tmp_path / "config.yaml"
    config.write_text(
        f"outdir: {tmp_path / 'results'}\ninputs: [{tmp_path / 'proteome.fasta'}]\nmodel: {{checkpoint: demo}}\n"
    )
    common = ["-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), "--configfile", str(config)]
    # The shard count is known once the `shards` checkpoint ran: build worklist and shards here.
    built = subprocess.run(
        [*SNAKEMAKE, *common, "--cores", "2", str(tmp_path / "results/shards")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    for name in PROFILE_ENV:
        monkeypatch.delenv(name, raising=False)
    started = time.monotonic()
    result = subprocess.run(
        [*SNAKEMAKE, *common, "--profile", str(REPO / "profiles/slurm"), "-n"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "FOLDMILL_SLURM_STATUS_COMMAND": "squeue"},
    )
    planning_seconds = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr

    counts = job_counts(result.stdout)
    shards = sorted((tmp_path / "results/shards").glob("shard_*.tsv"))
    assert counts["fold"] == len(shards) == -(-residues // 200_000)  # the default token budget
    assert counts["fold"] <= 100
    # Every fold job asks the GPU partition for a GPU, with memory and runtime sized per shard.
    fold_resources = re.findall(r"rule fold:.*?resources: ([^\n]*)", result.stdout, flags=re.DOTALL)
    assert len(fold_resources) == counts["fold"]
    assert all("gpu=1" in line and "slurm_partition=gpu" in line for line in fold_resources)
    assert len({re.search(r"mem_mb=(\d+)", line).group(1) for line in fold_resources}) > 1
    print(f"20,000 targets ({residues:,} residues): {counts['fold']} fold jobs, planned in {planning_seconds:.1f} s")


def test_local_profile_shares_the_configured_gpus(monkeypatch):
    monkeypatch.delenv("FOLDMILL_LOCAL_GPUS", raising=False)
    with open(REPO / "profiles/local/config.yaml") as stream:
        assert yte.process_yaml(stream, require_use_yte=True)["resources"] == {"gpu": 1}
    monkeypatch.setenv("FOLDMILL_LOCAL_GPUS", "4")
    with open(REPO / "profiles/local/config.yaml") as stream:
        profile = yte.process_yaml(stream, require_use_yte=True)
    assert profile["resources"] == {"gpu": 4}
    assert "executor" not in profile and profile["keep-going"] is True


def test_sinfo_gives_the_largest_node_of_each_partition():
    from foldmill.runtime.slurm_fit import DEFAULT_PARTITION, NodeCapacity, parse_sinfo

    listing = (
        "cpu*|2|24105|gpu:2\ncpu*|64|512000|(null)\ngpu|32|256000|gpu:h100:4(S:0-1)\n"
        "big|128+|2000000|gpu:a100:2,shard:8\n"
    )
    partitions = parse_sinfo(listing)
    assert partitions["cpu"] == partitions[DEFAULT_PARTITION] == NodeCapacity(cpus=64, mem_mb=512000, gpus=2)
    assert partitions["gpu"] == NodeCapacity(cpus=32, mem_mb=256000, gpus=4)
    assert partitions["big"] == NodeCapacity(cpus=128, mem_mb=2000000, gpus=2)


def test_a_job_no_node_can_run_fails_in_one_line_naming_the_setting():
    from foldmill.errors import FoldmillError
    from foldmill.runtime.slurm_fit import JobRequest, NodeCapacity, check_requests

    partitions = {"": NodeCapacity(2, 24000, 0), "cpu": NodeCapacity(2, 24000, 0), "gpu": NodeCapacity(2, 24000, 2)}
    fitting = [JobRequest("stage_msas", "", 2, 4000, 0, "msa.threads"), JobRequest("fold", "gpu", 2, 20000, 2)]
    check_requests(fitting, partitions)
    with pytest.raises(FoldmillError) as error:
        check_requests([JobRequest("stage_msas", "", 8, 4000, 0, "msa.threads"),
                        JobRequest("fold", "cpu", 1, 64000, 1, "slurm.gpus_per_node"),
                        JobRequest("moe_pretrain", "h100", 1, 1000, 1)], partitions)  # fmt: skip
    assert str(error.value) == (
        "stage_msas: asks 8 CPUs per node (largest node: 2) in the default partition: it would stay PENDING forever;"
        " lower msa.threads or pick another partition; "
        "fold: asks 64000 MB per node (largest node: 24000), 1 GPUs per node (largest node: 0) in partition 'cpu':"
        " it would stay PENDING forever; lower slurm.gpus_per_node or pick another partition; "
        "moe_pretrain: Slurm has no partition 'h100' (partitions: cpu, gpu)"
    )


def test_only_retryable_failures_grow_memory_and_run_again(tmp_path):
    from foldmill.errors import FoldmillError
    from foldmill.runtime import retry

    log = tmp_path / "logs/fold/shard_0000.log"
    assert [retry.growth(log, attempt) for attempt in (1, 2, 3)] == [1, 2, 3]  # e.g. out of memory
    retry.fail_if_recorded(log, 2)  # nothing recorded: the retry runs
    retry.record(log, "boltz2_conf.ckpt: checkpoint file not found")
    assert [retry.growth(log, attempt) for attempt in (1, 2, 3)] == [1, 1, 1]
    with pytest.raises(FoldmillError, match="checkpoint file not found .not retried"):
        retry.fail_if_recorded(log, 2)
    retry.fail_if_recorded(log, 1)  # a new run (input possibly fixed) starts clean
    assert retry.recorded(log) is None and retry.growth(log, 3) == 3


def test_each_folded_target_gets_a_line_with_its_shard_job_and_node(tmp_path, caplog):
    import logging

    from foldmill.runtime.job_log import JOB_TABLE_COLUMNS, write_job_table

    fold_table = tmp_path / "shard_0003.tsv"
    fold_table.write_text(
        "target_id\tstatus\treason\tn_tokens\tseconds\treplica\tprediction_dir\n"
        "Q1\tok\t\t120\t81.234\tgpu0@gpu07\tpredictions/Q1\n"
        "Q2\tfailed\tout of memory\t9000\t3.0\tgpu1@gpu07\t\n"
    )
    with caplog.at_level(logging.INFO, logger="foldmill.runtime.job_log"):
        path = tmp_path / "shard_0003.jobs.tsv"
        write_job_table(fold_table, "shard_0003", path, {"SLURM_JOB_ID": "4711", "SLURMD_NODENAME": "gpu07"})
    table = pd.read_csv(path, sep="\t", dtype=str)
    assert list(table.columns) == JOB_TABLE_COLUMNS
    assert table.values.tolist() == [
        ["Q1", "shard_0003", "4711", "gpu07", "ok", "81.2"],
        ["Q2", "shard_0003", "4711", "gpu07", "failed", "3.0"],
    ]
    assert "target Q1 shard shard_0003 job 4711 node gpu07 status ok seconds 81.2" in caplog.messages


def test_cuda_fold_jobs_without_gpus_are_refused_before_planning_anything():
    from foldmill.errors import FoldmillError
    from foldmill.runtime.slurm_plan import check_plan

    refused = "^model.device is cuda but slurm.gpus_per_node is 0: fold jobs would get no GPU$"
    with pytest.raises(FoldmillError, match=refused):
        check_plan(None, fold_cpus=8, fold_gpus=0, fold_mem_mb=16000, device="cuda")


def test_conda_envs_install_this_checkout_never_a_package_from_an_index(tmp_path):
    """envs/*.yaml (snakemake --sdm conda) install the checkout the workflow runs from, editable; pip
    resolves their lines to this checkout. Building the environments needs conda, which CI lacks."""
    import json

    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    used = {Path(path).name for path in re.findall(r'env_path\("([\w.]+)"\)', "".join(
        path.read_text() for path in (REPO / "rules").glob("*.smk")))}  # fmt: skip
    assert used == {path.name for path in (REPO / "envs").glob("*.yaml")}
    lines = set()
    for name in sorted(used):
        environment = yaml.safe_load((REPO / "envs" / name).read_text())
        pip = next(item["pip"] for item in environment["dependencies"] if isinstance(item, dict))
        assert len(pip) == 1 and re.fullmatch(r"--editable \$\{FOLDMILL_CHECKOUT\}(\[\w+\])?", pip[0]), (name, pip)
        lines.add(pip[0])
    for line in sorted(lines):
        wanted = re.findall(r"\[(\w+)\]", line)
        assert set(wanted) <= extras, line
        # What pip (which conda runs on these lines) would install, with FOLDMILL_CHECKOUT as the workflow sets it.
        requirements = tmp_path / "requirements.txt"
        requirements.write_text(line + "\n")
        report = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation", "--no-index",
             "--quiet", "--report", "-", "-r", str(requirements)],
            capture_output=True, text=True, timeout=300, env={**os.environ, "FOLDMILL_CHECKOUT": str(REPO)},
        )  # fmt: skip
        assert report.returncode == 0, report.stderr
        (install,) = json.loads(report.stdout)["install"]
        assert install["metadata"]["name"] == "foldmill" and install["download_info"]["dir_info"] == {"editable": True}
        assert install["download_info"]["url"] == REPO.as_uri()
        assert install.get("requested_extras", []) == wanted


def test_sacct_records_become_one_line_per_failed_job_with_its_reason(tmp_path):
    """What the end of a Slurm run lists (the accounting itself is exercised in test_slurm_cluster)."""
    from foldmill.runtime.slurm_accounting import failure_lines, jobs_from_logs, parse_sacct

    # sacct --parsable2 --noheader --format=JobIDRaw,State,ExitCode,ReqMem,MaxRSS,Elapsed,Timelimit,NodeList,Comment
    output = (
        "5|FAILED|1:0|2000M||00:00:37|00:15:00|gpu07|\n"
        "5.batch|FAILED|1:0||178172K||||\n"
        "5.0|CANCELLED by 0|0:9||2097712K||||\n"
        "6|COMPLETED|0:0|4000M||00:00:20|00:30:00|gpu07|\n"
        "7|TIMEOUT|0:0|16000M||06:00:00|06:00:00|gpu08|rule_fold_wildcards_shard_0003\n"
        "8|OUT_OF_MEMORY|0:125|8000M||00:10:00|01:00:00|gpu09|\n"
        "9|FAILED|2:0|4000M||00:00:05|01:00:00|cpu01|\n"
    )
    records = {record.job_id: record for record in parse_sacct(output)}
    assert records["5"].exit_code == "0:9" and records["5"].max_rss_mb == 2049  # from the killed step
    logs = tmp_path / "slurm_logs"
    for relative in ("rule_shards/5.log", "rule_shards/6.log", "rule_worklist/9.log"):
        (logs / relative).parent.mkdir(parents=True, exist_ok=True)
        (logs / relative).write_text("")
    labels = jobs_from_logs(logs, since=0)
    assert labels == {"5": "rule shards", "6": "rule shards", "9": "rule worklist"}
    assert jobs_from_logs(logs, since=time.time() + 60) == {}  # logs of earlier runs are not this run's
    assert failure_lines(records.values(), labels) == [
        "Slurm job 5 (rule shards) on gpu07: FAILED, killed by signal 9, used 2049 MB of 2000 MB memory, out of memory",
        "Slurm job 7 (rule_fold_wildcards_shard_0003) on gpu08: TIMEOUT, time limit 06:00:00 reached",
        "Slurm job 8 (?) on gpu09: OUT_OF_MEMORY, killed by signal 125, out of memory",
        "Slurm job 9 (rule worklist) on cpu01: FAILED, exit code 2",
    ]
