"""Expert parallelism on CPU (gloo): the EP model equals one process, and checkpoints reshard.

Worker processes are spawned and joined by gloo, as torchrun would join them. Each builds the
tiny model from the same seed, shards it (moe.parallel) and runs its part of a global batch; the
test compares logits, the gradient norm and every (clipped) gradient with one process running
the whole batch. Then a 2-process EP=2 FSDP2 run through the CLI (`--processes 2`, torchrun) is
resumed from its step-2 checkpoint at EP=1 (one process) and EP=4 (four, DDP) with the same
global batch: the step-3 loss and the step-3 parameters must match.

The load-balancing loss is off here: like DDP, each process computes it over its own batch, so
its gradient depends on how the batch is split (expert parallelism does not change that).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from foldmill.cli import main as cli_main
from foldmill.errors import FoldmillError
from foldmill.moe.config import ModelConfig, TrainConfig, model_config
from foldmill.moe.data.corpus import prepare_corpus
from foldmill.moe.data.loader import BatchSampler
from foldmill.moe.model.decoder import MoEDecoder
from foldmill.moe.model.moe import Experts
from foldmill.moe.parallel.benchmark import main as benchmark_main
from foldmill.moe.parallel.gradients import clip_grad_norm, reduce_expert_gradients
from foldmill.moe.parallel.mesh import build_mesh, data_parallel_size
from foldmill.moe.parallel.sharding import shard_experts, sharded_expert_parameters
from foldmill.moe.train.checkpoint import load_model_weights, read_state
from foldmill.moe.train.distributed import Dist, init_distributed, wrap_model
from foldmill.moe.train.launch import launch_command
from foldmill.moe.train.loss import autocast
from foldmill.moe.train.trainer import Trainer, model_parameters
from foldmill.runtime.ray_slurm import Allocation

SEQUENCES_PER_RANK, SEQ_LEN = 2, 16
MAX_NORM = 0.05  # below the gradient norm (~1.3-1.9): clipping is active, so it is checked too
# (backend, parallel, ep): every backend at EP=2; dp x ep = 2 x 2 and EP=4 with four processes.
BACKENDS = ("loop", "grouped", "fp8_rowwise", "mxfp8", "quack")
CASES_2 = [(backend, parallel, 2) for backend in BACKENDS for parallel in ("ddp", "fsdp")]
CASES_4 = [("grouped", "fsdp", 2), ("loop", "ddp", 2), ("mxfp8", "ddp", 4), ("fp8_rowwise", "fsdp", 4)]
# The CLI run: EP=2, 2 sequences per process; resumed with the same 4 sequences per step at EP=1 and EP=4.
# In fp32, where the layouts agree to float32 rounding.
RUN = dict(steps=3, batch_size=2, seq_len=32, warmup_steps=1, checkpoint_every=2, log_every=1, eval_batches=1,
           aux_loss_coef=0.0, parallel="fsdp", expert_parallel=2, precision="fp32", lr=3e-3)


def tiny(backend: str) -> ModelConfig:
    return model_config("tiny", expert_backend=backend, aux_loss_coef=0.0)


def global_batch(world_size: int, vocab_size: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(4, vocab_size, (world_size * SEQUENCES_PER_RANK, SEQ_LEN + 1), generator=generator)


def next_token_loss(model: torch.nn.Module, tokens: torch.Tensor, precision: str) -> tuple[torch.Tensor, torch.Tensor]:
    with autocast(tokens.device, precision):
        logits = model(tokens[:, :-1]).logits
    return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()), logits


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return float((got - want).norm() / want.norm())


def tolerance(precision: str) -> float:
    return 1e-5 if precision == "fp32" else 2e-2  # bf16 on GPUs: kernels may tile differently by row count


# --- worker processes --------------------------------------------------------------------------


def _process(rank: int, world_size: int, port: int, job, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    env = init_distributed()
    try:
        job(env, *args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_processes(world_size: int, job, *args, timeout: float = 240) -> None:
    """job(env, *args) in `world_size` spawned processes joined by gloo; raises what a process raised."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = torch.multiprocessing.start_processes(
        _process, args=(world_size, port, job, args), nprocs=world_size, start_method="spawn", join=False
    )
    deadline = time.monotonic() + timeout
    try:
        # join() returns once any process ends (raising if it failed): wait until all have.
        while not context.join(max(deadline - time.monotonic(), 0.1)):
            if time.monotonic() > deadline:
                raise AssertionError(f"{world_size} processes did not finish within {timeout:.0f} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()


def ep_step(env: Dist, backend: str, parallel: str, ep: int, out_dir: Path, precision: str) -> None:
    """One forward/backward of this rank's part of the global batch; saves logits, norm and gradients."""
    config = tiny(backend)
    torch.manual_seed(0)
    model = MoEDecoder(config).to(env.device)
    wrapped = wrap_model(model, parallel, env, ep)
    tokens = global_batch(env.world_size, config.vocab_size).chunk(env.world_size)[env.rank].to(env.device)
    loss, logits = next_token_loss(wrapped, tokens, precision)
    loss.backward()
    reduce_expert_gradients(model)
    norm = clip_grad_norm(model, MAX_NORM)
    experts = sharded_expert_parameters(model)
    grads = {}
    for name, parameter in model.named_parameters():
        grad = parameter.grad
        if name in experts:  # this rank's shard (E / ep experts)
            grads[name] = grad.to_local() if hasattr(grad, "to_local") else grad
        else:  # dense: FSDP2 shards are gathered (a collective: every rank, same order)
            grads[name] = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
    grads = {name: grad.cpu() for name, grad in grads.items()}
    result = {"logits": logits.detach().cpu(), "norm": norm.detach().cpu(), "grads": grads}
    torch.save(result, out_dir / f"{backend}-{parallel}-ep{ep}-rank{env.rank}.pt")


def ep_steps(env: Dist, cases: list, out_dir: Path, precision: str = "fp32") -> None:
    for backend, parallel, ep in cases:
        ep_step(env, backend, parallel, ep, out_dir, precision)


def zero_row_dispatch(env: Dist, precision: str) -> None:
    """Every token picks experts 0 and 1, both on rank 0: rank 1 receives no rows at all. The
    sharded Experts module must still match the whole one (outputs and every gradient)."""
    config = tiny("grouped")
    torch.manual_seed(0)
    whole = Experts(config).to(env.device)
    for parameter in whole.parameters():
        torch.nn.init.normal_(parameter, std=0.1)
    sharded = copy.deepcopy(whole)
    shard_experts(sharded, build_mesh(env.world_size, env.world_size, config.num_experts, env.device))
    generator = torch.Generator().manual_seed(2)
    tokens = 6 * env.world_size
    x = torch.randn(tokens, config.hidden_size, generator=generator).to(env.device)
    weights = torch.rand(tokens, 2, generator=generator).softmax(-1).to(env.device)
    experts = torch.tensor([[0, 1], [1, 0]]).repeat(tokens // 2, 1).to(env.device)
    grad_out = torch.randn(tokens, config.hidden_size, generator=generator).to(env.device)
    mine = slice(6 * env.rank, 6 * (env.rank + 1))
    results = []
    for module, part in ((whole, slice(None)), (sharded, mine)):
        inputs = [x[part].clone().requires_grad_(), weights[part].clone().requires_grad_()]
        with autocast(env.device, precision):
            out = module(*inputs, experts[part])
        out.float().backward(grad_out[part])
        results.append([out, *(tensor.grad for tensor in inputs)])
    local = whole.gate_up_proj.shape[0] // env.world_size
    for got, want in zip(results[1], results[0]):
        assert relative(got, want[mine]) < tolerance(precision)
    for name in ("gate_up_proj", "down_proj"):
        want = getattr(whole, name).grad[local * env.rank : local * (env.rank + 1)]
        got = getattr(sharded, name).grad
        if env.rank:  # its experts got no token: zero gradients, but gradients all the same
            assert torch.equal(got, torch.zeros_like(got))
        else:
            assert relative(got, want) < tolerance(precision)


def two_process_job(env: Dist, out_dir: Path) -> None:
    ep_steps(env, CASES_2, out_dir)
    zero_row_dispatch(env, "fp32")
    benchmark_main(["--model", "tiny", "--expert-backend", "grouped", "--expert-parallel", "2", "--precision", "fp32",
                    "--seq-len", "32", "--warmup", "1", "--steps", "2", "--out", str(out_dir)])


def resume_training(env: Dist, corpus: Path, run_dir: Path, config: TrainConfig) -> None:
    Trainer(corpus, run_dir, config, env).fit()


def four_process_job(env: Dist, out_dir: Path, corpus: Path, run_dir: Path, config: TrainConfig) -> None:
    ep_steps(env, CASES_4, out_dir)
    resume_training(env, corpus, run_dir, config)


# --- the single-process reference and the comparison ------------------------------------------


def check_against_one_process(
    out_dir: Path, case: tuple, world_size: int, device: str = "cpu", precision: str = "fp32"
) -> None:
    backend, parallel, ep = case
    config = tiny(backend)
    torch.manual_seed(0)
    reference = MoEDecoder(config).to(device)
    loss, logits = next_token_loss(reference, global_batch(world_size, config.vocab_size).to(device), precision)
    loss.backward()
    want_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), MAX_NORM)
    ranks = [torch.load(out_dir / f"{backend}-{parallel}-ep{ep}-rank{rank}.pt", weights_only=True)
             for rank in range(world_size)]
    for rank, (got, want) in enumerate(zip(ranks, logits.chunk(world_size))):
        assert relative(got["logits"], want) < tolerance(precision) / 10, (case, rank)
        assert got["norm"].item() == pytest.approx(want_norm.item(), rel=tolerance(precision) / 10)
    assert want_norm > 10 * MAX_NORM  # clipping was active
    for name, parameter in reference.named_parameters():
        want = parameter.grad
        if ranks[0]["grads"][name].shape != want.shape:  # expert shards: ranks 0..ep-1, replicated over dp
            got = torch.cat([ranks[rank]["grads"][name] for rank in range(ep)])
            for rank in range(ep, world_size):
                assert torch.equal(ranks[rank]["grads"][name], ranks[rank % ep]["grads"][name]), (case, name, rank)
        else:
            got = ranks[0]["grads"][name]
            assert all(torch.equal(r["grads"][name], got) for r in ranks), (case, name)
        assert relative(got, want) < tolerance(precision), (case, name, relative(got, want))


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> Path:
    out_dir = tmp_path_factory.mktemp("ep2")
    run_processes(2, two_process_job, out_dir)
    return out_dir


@pytest.mark.parametrize("case", CASES_2, ids=lambda case: f"{case[0]}-{case[1]}")
def test_ep2_equals_one_process(two_processes, case):
    check_against_one_process(two_processes, case, 2)


def test_benchmark_measures_the_all_to_all_share(two_processes):
    result = json.loads((two_processes / "ep_bench_2gpu_ep2.json").read_text())
    assert (result["world_size"], result["expert_parallel"], result["data_parallel"]) == (2, 2, 1)
    assert result["tokens_per_step_per_gpu"] == 2 * 32 and result["tokens_per_second_per_gpu"] > 0
    assert result["all_to_all_ms_per_step"] > 0 and 0 < result["all_to_all_share"] < 1


# --- checkpoints across EP sizes -----------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, data_dir) -> Path:
    path = tmp_path_factory.mktemp("corpus")
    prepare_corpus([data_dir / "proteomes/yeast_chr1.fasta"], path, val_fraction=0.05)
    return path


@pytest.fixture(scope="module")
def ep2_run(corpus, tmp_path_factory) -> Path:
    """3 steps at EP=2 under FSDP2, started through the CLI (which runs torchrun), checkpoints at 2 and 3."""
    run_dir = tmp_path_factory.mktemp("ep2_run")
    options = [item for key, value in RUN.items() for item in (f"--{key.replace('_', '-')}", str(value))]
    command = [sys.executable, "-m", "foldmill", "pretrain", "train", "--corpus", str(corpus), "--run-dir",
               str(run_dir), "--processes", "2", *options]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.count("step 3: train loss") == 1, completed.stdout  # rank 0 reports, the launcher not
    return run_dir


def resumed_at(ep2_run: Path, run_dir: Path, **changes) -> TrainConfig:
    """A copy of the EP=2 run's step-2 checkpoint in run_dir, and the config to resume it with."""
    shutil.copytree(ep2_run / "checkpoints/step_00000002", run_dir / "checkpoints/step_00000002")
    saved = TrainConfig(**read_state(ep2_run / "checkpoints/step_00000002")["train_config"])
    return dataclasses.replace(saved, **changes)


def step_metrics(run_dir: Path, step: int) -> dict:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(line for line in lines if line["step"] == step and "loss" in line)


def checkpoint_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's weights in one process (global expert tensors), as `foldmill pretrain evaluate` loads them."""
    model = MoEDecoder(ModelConfig(**read_state(checkpoint)["model_config"]))
    load_model_weights(checkpoint, model)
    return dict(model.named_parameters())


def check_same_next_step(ep2_run: Path, run_dir: Path) -> None:
    want, got = step_metrics(ep2_run, 3), step_metrics(run_dir, 3)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)
    assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
    want_weights = checkpoint_weights(ep2_run / "checkpoints/step_00000003")
    got_weights = checkpoint_weights(run_dir / "checkpoints/step_00000003")
    for name, weight in want_weights.items():
        assert relative(got_weights[name].detach(), weight.detach()) < 1e-6, name


def test_cli_ep2_run(ep2_run):
    summary = json.loads((ep2_run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 3
    assert summary["train_config"]["expert_parallel"] == 2 and summary["train_config"]["parallel"] == "fsdp"
    # experts are stored in their global shape: 4 experts, whatever the layout that wrote them
    weights = checkpoint_weights(Path(summary["checkpoint"]))
    assert weights["layers.0.moe.experts.gate_up_proj"].shape[0] == 4


def test_ep2_checkpoint_resumes_at_ep1(ep2_run, corpus, tmp_path):
    config = resumed_at(ep2_run, tmp_path, batch_size=4, expert_parallel=1, parallel="ddp")
    trainer = Trainer(corpus, tmp_path, config)
    assert trainer.resume() and trainer.step == 2
    # the parameters as loaded are the EP=2 run's step-2 parameters
    saved = checkpoint_weights(ep2_run / "checkpoints/step_00000002")
    assert all(torch.equal(model_parameters(trainer)[name], weight) for name, weight in saved.items())
    trainer.fit()
    check_same_next_step(ep2_run, tmp_path)


@pytest.fixture(scope="module")
def four_processes(tmp_path_factory, ep2_run, corpus) -> tuple[Path, Path]:
    out_dir, run_dir = tmp_path_factory.mktemp("ep4"), tmp_path_factory.mktemp("ep4_run")
    config = resumed_at(ep2_run, run_dir, batch_size=1, expert_parallel=4, parallel="ddp")
    run_processes(4, four_process_job, out_dir, corpus, run_dir, config)
    return out_dir, run_dir


@pytest.mark.parametrize("case", CASES_4, ids=lambda case: f"{case[0]}-{case[1]}-dp{4 // case[2]}xep{case[2]}")
def test_four_process_layouts_equal_one_process(four_processes, case):
    check_against_one_process(four_processes[0], case, 4)


def test_ep2_checkpoint_resumes_at_ep4(four_processes, ep2_run):
    run_dir = four_processes[1]
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 4
    check_same_next_step(ep2_run, run_dir)


# --- layout checks, data order and launch commands (no processes) ---------------------------------


def test_layout_must_divide_processes_and_experts():
    assert data_parallel_size(8, 2, 8) == 4
    with pytest.raises(FoldmillError, match="must divide the number of processes"):
        data_parallel_size(6, 4, 8)
    with pytest.raises(FoldmillError, match=r"and of experts \(6\)"):
        data_parallel_size(4, 4, 6)
    with pytest.raises(FoldmillError, match="expert_parallel must be >= 1"):
        TrainConfig(expert_parallel=0)


def test_cli_refuses_an_expert_parallel_size_that_does_not_divide(corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    base = ["pretrain", "train", "--corpus", str(corpus), "--run-dir", str(tmp_path), "--steps", "1", "--seq-len", "64"]
    assert cli_main([*base, "--expert-parallel", "3"]) == 2
    assert cli_main([*base, "--nodes", "2"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(line.startswith("foldmill: error: ") for line in errors)
    assert "expert_parallel 3 must divide the number of processes (1) and of experts (4)" in errors[0]
    assert "needs a Slurm job of 2 nodes; found no Slurm allocation" in errors[1]


def test_sampler_resumes_the_global_batch_order_at_another_process_count():
    def global_batches(world_size: int, per_process: int, state: dict | None, steps: int) -> list[np.ndarray]:
        samplers = [BatchSampler(103, per_process, seed=5, rank=r, world_size=world_size) for r in range(world_size)]
        for sampler in samplers:
            if state:
                sampler.load_state_dict(state)
        return [np.sort(np.concatenate([s.next_indices() for s in samplers])) for _ in range(steps)]

    straight = global_batches(2, 2, None, 6)
    two = [BatchSampler(103, 2, seed=5, rank=rank, world_size=2) for rank in range(2)]
    for _ in range(3):
        for sampler in two:
            sampler.next_indices()
    state = two[0].state_dict()
    assert state["world_size"] == 2
    for world_size in (1, 4):
        resumed = global_batches(world_size, 4 // world_size, state, 3)
        assert all(np.array_equal(a, b) for a, b in zip(resumed, straight[3:]))


def test_launch_commands_single_node_and_across_a_slurm_job(monkeypatch):
    train = ["pretrain", "train", "--expert-parallel", "8"]
    command, environment = launch_command(train, 8)
    assert command[1:5] == ["-m", "torch.distributed.run", "--nproc-per-node=8", "--standalone"]
    assert command[-5:] == ["foldmill", *train] and environment["NCCL_NVLS_ENABLE"] == "0"

    allocation = Allocation(job_id="77", nodes=("gpu01", "gpu02", "gpu03"), this_node="gpu01", cpus_per_node=64,
                            gpus_per_node=8)
    monkeypatch.setattr("foldmill.runtime.ray_slurm.current_allocation", lambda: allocation)
    monkeypatch.setenv("SLURM_NTASKS", "1")  # a step-level variable the srun must not inherit
    command, environment = launch_command(train, 8, nodes=2)
    srun_end = command.index(sys.executable)
    assert command[:srun_end] == ["srun", "--jobid=77", "--overlap", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                                  "--nodelist=gpu01,gpu02", "--cpus-per-task=64", "--kill-on-bad-exit=1",
                                  "--gres=gpu:8"]
    torchrun = command[srun_end:]
    assert "--nnodes=2" in torchrun and "--nproc-per-node=8" in torchrun and "--rdzv-id=77" in torchrun
    assert any(option.startswith("--rdzv-endpoint=") for option in torchrun) and "--standalone" not in torchrun
    assert "SLURM_NTASKS" not in environment and environment["NCCL_NVLS_ENABLE"] == "0"
    with pytest.raises(FoldmillError, match="needs a Slurm job of 4 nodes; found an allocation of 3 node"):
        launch_command(train, 8, nodes=4)


# --- on two GPUs (NCCL): skipped here, run on a machine with >= 2 GPUs --------------------------

GPU_CASES = [("grouped", "fsdp", 2), ("fp8_rowwise", "ddp", 2), ("mxfp8", "fsdp", 2)]


def two_gpu_job(env: Dist, out_dir: Path) -> None:
    ep_steps(env, GPU_CASES, out_dir, "bf16-mixed")
    zero_row_dispatch(env, "bf16-mixed")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_ep2_on_two_gpus_equals_one_gpu(tmp_path):
    run_processes(2, two_gpu_job, tmp_path)
    for case in GPU_CASES:
        check_against_one_process(tmp_path, case, 2, device="cuda", precision="bf16-mixed")


def test_the_ep_benchmark_keeps_a_result_file_it_did_not_write(tmp_path):
    mine = tmp_path / "ep_bench_1gpu_ep1.json"
    mine.write_text("mine\n")
    args = ["--model", "tiny", "--expert-backend", "grouped", "--precision", "fp32", "--seq-len", "32", "--warmup", "1",
            "--steps", "1", "--out", str(tmp_path)]
    with pytest.raises(FoldmillError, match=r"holds files foldmill ep-bench did not write \(e.g. ep_bench_1gpu_ep1"):
        benchmark_main(args)
    assert mine.read_text() == "mine\n"
    mine.unlink()
    benchmark_main(args)  # then its own result, twice
    benchmark_main(args)
    assert json.loads(mine.read_text())["world_size"] == 1
