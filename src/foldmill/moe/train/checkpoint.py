"""Checkpoints through torch.distributed.checkpoint (sharded with FSDP2, plain with DDP or one process).

Experts split by expert parallelism are saved in their global shape (moe.parallel.sharding), so
a checkpoint resumes under any other process count or expert-parallel size, or in one process.

checkpoints/step_00000100/   DCP files of {"model", "optim"} + trainer_state.json (step, data
sampler, configs). A checkpoint is written under a hidden temporary name and renamed when complete,
so the newest step_* directory is always whole. Non-tensor state is JSON: nothing is unpickled.

Weights stored in bf16 with float32 masters (bf16-mixed in one process, train/precision.py) are
saved and loaded as their masters, so every bf16-mixed checkpoint holds float32 weights.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from foldmill.errors import CheckpointError, one_line
from foldmill.moe.parallel.sharding import expert_state_to_global, expert_state_to_local
from foldmill.moe.train.distributed import Dist, barrier, unwrap

STATE_FILE = "trainer_state.json"


def _single_process() -> bool:
    return not dist.is_initialized()


@contextlib.contextmanager
def _quiet_single_process():
    """DCP warns on every call without a process group, although single-process use is intended."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def step_directory(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step:08d}"


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root`, if any."""
    complete = sorted(p for p in Path(root).glob("step_*") if (p / STATE_FILE).is_file())
    return complete[-1] if complete else None


def resolve_checkpoint(path: str | Path) -> Path:
    """`path` if it is a checkpoint, else the newest complete checkpoint of the run directory (or its
    checkpoints/ folder) it names: users point at the run they trained."""
    path = Path(path)
    if (path / STATE_FILE).is_file():
        return path
    for root in (path / "checkpoints", path):
        newest = latest_checkpoint(root)
        if newest is not None:
            return newest
    problem = "no such directory" if not path.exists() else f"neither a checkpoint ({STATE_FILE}) nor a run holding one"
    raise CheckpointError(f"{path}: {problem}")


def save_checkpoint(
    root: str | Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, env: Dist,
    keep_last: int = 2,
) -> Path:
    root = Path(root)
    final = step_directory(root, step)
    temporary = root / f".{final.name}.tmp"
    if env.is_main:
        shutil.rmtree(temporary, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
    barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    model_state.update(_masters_by_key(model_state, optimizer))
    expert_state_to_global(model_state, optim_state, unwrap(model))
    try:
        with _quiet_single_process():
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=temporary, no_dist=_single_process())
    except CheckpointException as error:
        raise CheckpointError(f"{final}: cannot write checkpoint: {_first_failure(error)}") from None
    barrier()
    if env.is_main:
        (temporary / STATE_FILE).write_text(json.dumps({**state, "step": step}, indent=2), encoding="utf-8")
        shutil.rmtree(final, ignore_errors=True)
        temporary.rename(final)
        for old in sorted(p for p in root.glob("step_*") if (p / STATE_FILE).is_file())[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    barrier()
    return final


def read_state(path: str | Path) -> dict:
    state_file = Path(path) / STATE_FILE
    try:
        return json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{state_file}: cannot read trainer state ({error})") from None


def load_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Restore model and optimizer in place from `path`; returns the trainer state."""
    state = read_state(path)
    model_state, optim_state = get_state_dict(model, optimizer)
    masters = _masters_by_key(model_state, optimizer)
    model_state.update({key: torch.empty_like(master) for key, master in masters.items()})
    expert_state_to_global(model_state, optim_state, unwrap(model))
    loaded = {"model": model_state, "optim": optim_state}
    try:
        with _quiet_single_process():
            dcp.load(loaded, checkpoint_id=Path(path), no_dist=_single_process())
    except (Exception, CheckpointException) as error:  # DCP raises assorted errors (missing keys, bad files)
        raise CheckpointError(f"{path}: cannot load checkpoint: {_first_failure(error)}") from None
    expert_state_to_local(loaded["model"], loaded["optim"], unwrap(model))
    for key, master in masters.items():
        master.copy_(loaded["model"][key])
    set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    return state


def _first_failure(error: BaseException) -> str:
    """What went wrong, in one line. DCP wraps each rank's error in a CheckpointException, a
    BaseException whose text holds every rank's traceback: its first rank's error stands for it."""
    if isinstance(error, CheckpointException) and error.failures:
        error = next(iter(error.failures.values()))[0]
    return one_line(error)


def _masters_by_key(model_state: dict, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """{model state key: float32 master} for the weights the optimizer keeps masters of."""
    by_address = {param.data_ptr(): master for param, master in getattr(optimizer, "master_weights", {}).items()}
    return {key: by_address[value.data_ptr()] for key, value in model_state.items()
            if isinstance(value, torch.Tensor) and value.data_ptr() in by_address}


def load_model_weights(path: str | Path, model: nn.Module) -> dict:
    """Restore only the model weights (for evaluation); returns the trainer state."""
    state = read_state(path)
    model_state = get_model_state_dict(model)
    expert_state_to_global(model_state, None, unwrap(model))
    try:
        with _quiet_single_process():
            dcp.load({"model": model_state}, checkpoint_id=Path(path), no_dist=_single_process())
    except (Exception, CheckpointException) as error:
        raise CheckpointError(f"{path}: cannot load model weights: {_first_failure(error)}") from None
    expert_state_to_local(model_state, None, unwrap(model))
    set_model_state_dict(model, model_state)
    return state
