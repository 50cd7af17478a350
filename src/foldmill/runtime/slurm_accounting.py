"""What Slurm's accounting database (sacct) says about a run's jobs.

The Snakemake Slurm plugin reports a failed job by its state alone (and, polling through squeue,
"Detailed failure reason unavailable"). Where the cluster keeps accounting, sacct knows why: the
state (OUT_OF_MEMORY, TIMEOUT, NODE_FAIL, ...), the exit code or signal, and the memory the job
used against what it asked for. At the end of a run the workflow lists every job of the run that
did not complete with that reason (rules/common.smk), retried ones included.

`status_command` picks the profile's job status command: sacct where accounting answers, squeue
otherwise (without accounting sacct knows no job and the plugin would wait forever).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

SACCT_FIELDS = ("JobIDRaw", "State", "ExitCode", "ReqMem", "MaxRSS", "Elapsed", "Timelimit", "NodeList", "Comment")
STATUS_COMMANDS = ("auto", "sacct", "squeue")
TIMEOUT_S = 20


@dataclass(frozen=True)
class JobRecord:
    """One Slurm job as sacct records it (its steps folded in: the largest memory use, a killing signal)."""

    job_id: str
    state: str
    exit_code: str  # "code:signal"
    req_mem_mb: int
    max_rss_mb: int
    elapsed: str
    time_limit: str
    nodes: str
    comment: str  # the Slurm plugin's rule_<rule>_wildcards_<...>, where the cluster keeps comments

    def reason(self) -> str:
        """Why the job did not complete, in words."""
        code, _, signal = self.exit_code.partition(":")
        parts = [self.state]
        if signal not in ("", "0"):
            parts.append(f"killed by signal {signal}")
        elif code not in ("", "0"):
            parts.append(f"exit code {code}")
        if self.req_mem_mb and self.max_rss_mb:
            parts.append(f"used {self.max_rss_mb} MB of {self.req_mem_mb} MB memory")
        if self.state == "OUT_OF_MEMORY" or (self.req_mem_mb and self.max_rss_mb > self.req_mem_mb):
            parts.append("out of memory")
        elif self.state == "TIMEOUT":
            parts.append(f"time limit {self.time_limit} reached")
        return ", ".join(parts)


def _mb(value: str) -> int:
    """sacct's memory (e.g. 2000M, 3.5G, 550776K, per node or per CPU suffixes n/c) in MB."""
    found = re.match(r"([\d.]+)([KMGT]?)", value.strip())
    if not found:
        return 0
    scale = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024, "": 1 / (1024 * 1024)}[found.group(2)]
    return round(float(found.group(1)) * scale)


def parse_sacct(output: str) -> list[JobRecord]:
    """Jobs from `sacct --parsable2 --noheader --format=<SACCT_FIELDS>` output: a job's steps
    (<id>.batch, <id>.0) give its largest memory use and a signal that killed a step."""
    jobs: dict[str, dict[str, str]] = {}
    steps: dict[str, list[dict[str, str]]] = {}
    for line in output.splitlines():
        values = line.split("|")
        if len(values) != len(SACCT_FIELDS):
            continue
        row = dict(zip(SACCT_FIELDS, values))
        job_id, _, step = row["JobIDRaw"].partition(".")
        if step:
            steps.setdefault(job_id, []).append(row)
        else:
            jobs[job_id] = row
    records = []
    for job_id, row in jobs.items():
        own_steps = steps.get(job_id, [])
        max_rss = max([_mb(step["MaxRSS"]) for step in own_steps] + [_mb(row["MaxRSS"])])
        exit_code = row["ExitCode"]
        if exit_code.endswith(":0"):  # a step killed by a signal says more than the batch script's code
            exit_code = next((step["ExitCode"] for step in own_steps if not step["ExitCode"].endswith(":0")), exit_code)
        records.append(
            JobRecord(
                job_id=job_id,
                state=row["State"].split()[0],  # "CANCELLED by 0" -> CANCELLED
                exit_code=exit_code,
                req_mem_mb=_mb(row["ReqMem"]),
                max_rss_mb=max_rss,
                elapsed=row["Elapsed"],
                time_limit=row["Timelimit"],
                nodes=row["NodeList"],
                comment=row["Comment"],
            )
        )
    return sorted(records, key=lambda record: int(record.job_id) if record.job_id.isdigit() else 0)


def query_jobs(job_ids: Iterable[str]) -> list[JobRecord]:
    """sacct's records of these jobs ([] when sacct is missing or fails: accounting is optional)."""
    ids = sorted({str(job_id) for job_id in job_ids if str(job_id).isdigit()}, key=int)
    if not ids or not shutil.which("sacct"):
        return []
    command = ["sacct", "--parsable2", "--noheader", f"--format={','.join(SACCT_FIELDS)}", "--jobs", ",".join(ids)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_sacct(done.stdout) if done.returncode == 0 else []


def jobs_from_logs(log_dir: Path, since: float) -> dict[str, str]:
    """The Slurm jobs whose plugin log (<log_dir>/rule_<rule>/<wildcards>/<jobid>.log) was written
    since `since` (a time.time()), the jobs of this run (failed jobs keep their logs), by id: what
    each ran, e.g. "rule fold, shard_0003" (sacct keeps a job's comment only on some clusters)."""
    if not log_dir.is_dir():
        return {}
    jobs = {}
    for path in log_dir.rglob("*.log"):
        try:
            if not (path.stem.isdigit() and path.stat().st_mtime >= since):
                continue
        except OSError:
            continue
        rule, *wildcards = path.parent.relative_to(log_dir).parts or ("?",)
        jobs[path.stem] = ", ".join([f"rule {rule.removeprefix('rule_')}", *wildcards])
    return jobs


def failure_lines(records: Iterable[JobRecord], labels: Mapping[str, str] | None = None) -> list[str]:
    """One line per job that did not complete: job id, what it ran (`labels` by job id, else its
    comment), node, reason."""
    labels = labels or {}
    return [
        f"Slurm job {record.job_id} ({labels.get(record.job_id) or record.comment or '?'}) on "
        f"{record.nodes or 'no node'}: {record.reason()}"
        for record in records
        if record.state not in ("COMPLETED", "PENDING", "RUNNING", "REQUEUED")
    ]


def accounting_answers() -> bool:
    """True when the cluster keeps accounting in slurmdbd and sacct answers."""
    if not (shutil.which("scontrol") and shutil.which("sacct")):
        return False
    try:
        config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=TIMEOUT_S)
        if config.returncode != 0 or not re.search(r"^AccountingStorageType\s*=\s*accounting_storage/slurmdbd",
                                                   config.stdout, flags=re.MULTILINE):  # fmt: skip
            return False
        probe = subprocess.run(["sacct", "--noheader", "-X", "--jobs", "1", "--format=JobIDRaw"],
                               capture_output=True, text=True, timeout=TIMEOUT_S)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def status_command(environ: Mapping[str, str]) -> str:
    """The Slurm plugin's status command: FOLDMILL_SLURM_STATUS_COMMAND (auto, sacct or squeue);
    auto = sacct where accounting answers, else squeue."""
    wanted = environ.get("FOLDMILL_SLURM_STATUS_COMMAND", "auto").strip() or "auto"
    if wanted not in STATUS_COMMANDS:
        raise ValueError(f"FOLDMILL_SLURM_STATUS_COMMAND must be one of {', '.join(STATUS_COMMANDS)}, not {wanted!r}")
    if wanted != "auto":
        return wanted
    return "sacct" if accounting_answers() else "squeue"
