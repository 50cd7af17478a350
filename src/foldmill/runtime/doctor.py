"""What this machine offers foldmill: CUDA, GPU architecture, kernels, Ray, Slurm, MMseqs2."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess

from foldmill.errors import FoldmillError
from foldmill.msa import mmseqs
from foldmill.msa.colabfold import cuda_build


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _command_version(command: list[str]) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:  # e.g. Slurm's client installed on a machine with no cluster configured
        errors = done.stderr.strip().splitlines()
        return f"installed, but `{' '.join(command)}` fails" + (f": {errors[-1]}" if errors else "")
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if lines else "present"


def environment_report() -> list[tuple[str, str]]:
    """(item, finding) pairs, in display order."""
    import torch

    rows: list[tuple[str, str]] = [("foldmill", _version("foldmill") or "not installed as a package")]
    rows.append(("torch", torch.__version__))
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            rows.append(
                (f"cuda:{index}", f"{props.name}, sm_{props.major}{props.minor}, {props.total_memory / 2**30:.1f} GiB")
            )
    else:
        rows.append(("cuda", "not available (CPU mode)"))
    rows.append(("triton", _version("triton") or "not installed"))
    rows.append(("cuequivariance-torch", _version("cuequivariance-torch") or "not installed"))
    ops = _version("cuequivariance-ops-torch-cu13") or _version("cuequivariance-ops-torch-cu12")
    rows.append(("cuequivariance ops", ops or "not installed (kernels fall back to PyTorch)"))
    rows.append(("ray", _version("ray") or "not installed"))
    rows.append(("snakemake", _version("snakemake") or "not installed"))
    rows.append(("slurm", _command_version(["sinfo", "--version"]) or "not found"))
    rows.append(("mmseqs", mmseqs.mmseqs_version()))
    rows.append(("mmseqs gpu search", _mmseqs_gpu()))
    return rows


def _mmseqs_gpu() -> str:
    """Whether the MMseqs2 binary can run the GPU search (msa.gpu)."""
    try:
        binary = mmseqs.mmseqs_binary()
    except FoldmillError:
        return "no mmseqs"
    if cuda_build(binary):
        return "CUDA build (msa.gpu auto uses it with padded databases)"
    return "CPU build (no GPU search)"
