"""The Ray replica executor on a local Ray instance: the real demo model folding real targets.

One Ray session serves the module (start-up costs seconds on two cores). Fault tests kill a real
replica actor mid-run, feed unusable targets, or use stages that crash or report a CUDA error.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
from ray import cloudpickle

from foldmill.bench.throughput import PassThrough, plan_only, synthetic_worklist
from foldmill.errors import FoldmillError
from foldmill.executor.cluster import ray_session, start_pools, stop_pools
from foldmill.executor.engine import Engine, FeaturizeStage, FoldInput, Staging, kernel_cache_dir, use_kernel_cache
from foldmill.executor.faults import TargetRejected
from foldmill.executor.plan import WorkItem
from foldmill.executor.records import journal_path
from foldmill.executor.run import fold_targets, work_items
from foldmill.executor.scheduler import Scheduler
from foldmill.executor.settings import ExecutorSettings, ModelSettings
from foldmill.io.targets import Entity, Target
from foldmill.io.worklist import build_worklist, summarize
from foldmill.model.config import InferenceRecipe
from foldmill.outputs.writer import DONE_MARKER

# The demo model cut to what CI can fold on two cores: no triangle blocks (their cost grows with
# the cube of the length), narrow widths, fewer distance bins (the pair-sized one-hots and logits
# dominate what is left). The full Boltz-2 data path still runs: input embedding, relative
# positions, diffusion sampling with atom attention, confidence heads, the writers.
CI_DEMO_CONFIG = {
    "token_s": 32, "token_z": 8, "atom_s": 16, "atom_z": 4, "pairformer_blocks": 0, "msa_blocks": 0,
    "use_templates": False, "confidence_pairformer_blocks": 0, "token_transformer_depth": 1,
    "token_transformer_heads": 2, "diffusion_atom_encoder_depth": 1, "atom_decoder_depth": 1,
    "embedder_atom_encoder_depth": 1, "dim_fourier": 16, "num_bins": 16, "confidence_num_dist_bins": 16,
    "num_plddt_bins": 10, "num_pde_bins": 16, "num_pae_bins": 16,
}  # fmt: skip
CI_MODEL = ModelSettings("demo", "cpu", InferenceRecipe(0, 2, 1, 1, 0), demo_config=CI_DEMO_CONFIG)
# An explicit token budget: the estimate from free memory would depend on the machine's load.
CI_EXECUTOR = ExecutorSettings(cpus=2, object_store_mb=256, progress_seconds=5, token_budget=2000)

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the fault-injecting stages below


@pytest.fixture(scope="module")
def ray_instance():
    with ray_session(CI_EXECUTOR):
        yield


@pytest.fixture(scope="module")
def yeast_items(data_dir: Path) -> list[WorkItem]:
    return work_items(build_worklist([data_dir / "proteomes/yeast_chr1.fasta"]).table)


def small(items: list[WorkItem], count: int, max_tokens: int = 160) -> list[WorkItem]:
    return [item for item in items if item.n_tokens <= max_tokens][:count]


def protein_item(target_id: str, sequence: str, msa: str = "empty") -> WorkItem:
    target = Target(target_id, (Entity("protein", ("A",), sequence, msa=msa),), source="test", record=target_id)
    row = summarize(target)
    return WorkItem(target_id, int(row["n_tokens"]), str(row["content_hash"]), str(row["spec"]))


def journal_records(table: Path) -> list[dict]:
    return [json.loads(line) for line in journal_path(table).read_text().splitlines()]


def test_replica_killed_mid_run_every_target_completes_once(ray_instance, yeast_items, tmp_path: Path) -> None:
    items = small(yeast_items, 8)
    table = tmp_path / "fold" / "shard_0000.tsv"
    killed: list[str] = []

    def kill_replica_after_first_target() -> None:
        while not any((tmp_path / "predictions").glob(f"*/{DONE_MARKER}")):
            time.sleep(0.05)
        name = next(n["name"] for n in ray.util.list_named_actors(all_namespaces=True) if n["name"].startswith("replica0-"))
        ray.kill(ray.get_actor(name, namespace="foldmill"), no_restart=False)  # the process dies; Ray restarts it
        killed.append(name)

    killer = threading.Thread(target=kill_replica_after_first_target, daemon=True)
    killer.start()
    result = fold_targets(items, tmp_path, table, CI_MODEL, CI_EXECUTOR, Staging())
    killer.join(timeout=5)
    assert killed, "the replica was never killed"
    assert [r.status for r in result.records] == ["ok"] * len(items), result.summary
    lines = journal_records(table)
    assert sorted(line["target_id"] for line in lines) == sorted(item.target_id for item in items)  # once each
    assert any(line["attempts"] == 2 for line in lines), "the target on the killed replica was not retried"
    for item in items:
        assert (tmp_path / "predictions" / item.target_id / DONE_MARKER).exists()


def test_bad_targets_become_records_and_the_rest_fold(ray_instance, tmp_path: Path) -> None:
    wrong_msa = tmp_path / "other_protein.a3m"
    wrong_msa.write_text(">query\nGSHMLEDPVD\n>hit\nGSHMLEDPVE\n")  # the MSA of some other sequence
    items = [
        protein_item("fine_a", "MKTAYIAKQRQISFVKSHFSRQ"),
        protein_item("wrong_msa", "MKTAYIAKQRQISFVKSH", msa=str(wrong_msa)),
        protein_item("too_big", "MKTAYIAKQRQISFVKSHFSRQ" * 10),
        protein_item("fine_b", "GSHMLEDPVDAFQLGKQW"),
    ]
    executor = replace(CI_EXECUTOR, token_budget=150)
    result = fold_targets(items, tmp_path, tmp_path / "fold.tsv", CI_MODEL, executor, Staging())
    status = {r.target_id: (r.status, r.reason) for r in result.records}
    assert status["fine_a"] == ("ok", "") and status["fine_b"] == ("ok", "")
    assert status["wrong_msa"][0] == "failed" and "other_protein.a3m" in status["wrong_msa"][1]
    assert status["too_big"][0] == "rejected" and "exceed the token budget of 150" in status["too_big"][1]
    assert not (tmp_path / "predictions" / "wrong_msa").exists()
    assert (tmp_path / ".kernel-cache").is_dir()  # the replica's compiled-kernel cache, shared by the run's jobs


def test_replicas_keep_compiled_kernels_in_the_run_unless_the_environment_says(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", "")  # restored after the test, whatever it was
    assert kernel_cache_dir(CI_MODEL, tmp_path) == tmp_path / ".kernel-cache"
    assert kernel_cache_dir(replace(CI_MODEL, kernel_cache=str(tmp_path / "shared")), tmp_path) == tmp_path / "shared"
    Engine(CI_MODEL, kernel_cache=tmp_path / "cache")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "cache") and (tmp_path / "cache").is_dir()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "chosen"))
    use_kernel_cache(tmp_path / "other")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "chosen") and not (tmp_path / "other").exists()


def test_a_kernel_cache_that_cannot_be_created_is_a_warning(monkeypatch, tmp_path: Path, caplog) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", "")
    (tmp_path / "a_file").write_text("")
    with caplog.at_level("WARNING", logger="foldmill.executor.engine"):
        use_kernel_cache(tmp_path / "a_file" / "cache")
    assert os.environ["TRITON_CACHE_DIR"] == ""
    (message,) = [record.getMessage() for record in caplog.records]
    assert "a_file/cache: cannot create it" in message and "\n" not in message


class StickyOnReplicaZero(PassThrough):
    """A replica stage whose first GPU 'breaks': replica 0 reports a sticky CUDA error."""

    def __call__(self, payload: object) -> object:
        if ray.get_runtime_context().get_actor_name().startswith("replica0-"):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return payload


class CrashOnPoison(PassThrough):
    """A replica stage whose process dies (like a segfault) on one target."""

    def __call__(self, payload: object) -> object:
        if getattr(payload, "target_id", "") == "poison":
            os._exit(1)
        return payload


class SizedByReplica(PassThrough):
    """A replica stage whose budget depends on its GPU: replica 0 takes 100 tokens, replica 1 1,000."""

    def __init__(self) -> None:
        self.token_budget = 100 if ray.get_runtime_context().get_actor_name().startswith("replica0-") else 1000


def run_scheduler(replica_stage: type, items: list[WorkItem], replicas: int, max_attempts: int = 3) -> tuple[list, Scheduler]:
    settings = replace(CI_EXECUTOR, cpu_replicas=replicas, max_attempts=max_attempts)
    pools = start_pools(settings, "cpu", PassThrough, replica_stage, PassThrough, f"faults{time.monotonic_ns()}")
    records: list = []
    try:
        ray.get([slot.probe for slot in pools.replicas])  # every replica in service from the first dispatch
        scheduler = Scheduler(pools, items, settings.queue_depth, settings.max_attempts, records.append)
        scheduler.run()
    finally:
        stop_pools(pools)
    return records, scheduler


def test_sticky_cuda_error_retires_the_replica_and_its_targets_move(ray_instance) -> None:
    items = [WorkItem(f"t{i}", 10, "h", "{}") for i in range(8)]
    records, scheduler = run_scheduler(StickyOnReplicaZero, items, replicas=2)
    assert sorted(r.target_id for r in records) == sorted(i.target_id for i in items)
    assert {r.status for r in records} == {"ok"}
    assert {r.replica.split("@")[0] for r in records} == {"cpu1"}
    assert [slot.retired for slot in scheduler.pools.replicas] == [True, False]


def test_a_target_that_kills_its_replica_fails_after_max_attempts(ray_instance) -> None:
    items = [WorkItem("poison", 50, "h", "{}")] + [WorkItem(f"t{i}", 10, "h", "{}") for i in range(5)]
    records, _ = run_scheduler(CrashOnPoison, items, replicas=1, max_attempts=2)
    status = {r.target_id: r for r in records}
    assert len(records) == len(items)
    assert status["poison"].status == "failed" and "worker process died (2 times" in status["poison"].reason
    assert all(status[f"t{i}"].status == "ok" for i in range(5))


def test_each_target_goes_to_a_replica_it_fits_and_one_that_fits_none_is_rejected(ray_instance) -> None:
    items = [WorkItem("huge", 5000, "h", "{}"), WorkItem("big", 500, "h", "{}")]
    items += [WorkItem(f"t{i}", 10, "h", "{}") for i in range(6)]
    records, _ = run_scheduler(SizedByReplica, items, replicas=2)
    status = {r.target_id: r for r in records}
    assert len(records) == len(items)
    assert status["huge"].status == "rejected"
    assert "5000 tokens exceed the token budget of 1000" in status["huge"].reason
    assert status["big"].status == "ok" and status["big"].replica.startswith("cpu1@")
    assert all(status[f"t{i}"].status == "ok" for i in range(6))


def test_queues_stay_bounded_and_driver_memory_flat(ray_instance, tmp_path: Path) -> None:
    row = plan_only(synthetic_worklist(600, 0, 200, 2800), tmp_path, seed=0)
    assert row["peak_featurized"] <= row["queue_bound"]
    assert row["driver_rss_peak_mb"] - row["driver_rss_start_mb"] < 64, row


def test_out_of_memory_retries_one_sample_at_a_time_then_rejects(monkeypatch) -> None:
    model = replace(CI_MODEL, recipe=InferenceRecipe(0, 2, 2, 2, 0))
    engine = Engine(model)
    featurized = FeaturizeStage(Staging(), model)(protein_item("oom", "MKTAYIAKQRQISFVKSHFSRQ"))
    real_predict = engine.model.predict
    calls: list[int] = []

    def predict_within_memory(features, recipe):
        calls.append(recipe.max_parallel_samples)
        if recipe.max_parallel_samples > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB")
        return real_predict(features, recipe)

    monkeypatch.setattr(engine.model, "predict", predict_within_memory)
    prediction = engine(featurized)
    assert calls == [2, 1]
    assert prediction.coords.shape == (2, featurized.featurized.n_atoms, 3) and np.isfinite(prediction.coords).all()
    assert prediction.provenance["content_hash"] == featurized.content_hash

    monkeypatch.setattr(engine.model, "predict", lambda features, recipe: (_ for _ in ()).throw(torch.OutOfMemoryError("out of memory")))
    rejected = r"out of memory \(22 tokens; cpu memory, even denoising one sample at a time\)"
    with pytest.raises(TargetRejected, match=rejected):
        engine(FoldInput(featurized.featurized, featurized.features, featurized.content_hash))


def test_a_replica_that_cannot_load_its_model_stops_the_run_in_one_line(ray_instance, tmp_path: Path) -> None:
    checkpoint = tmp_path / "broken.ckpt"
    checkpoint.write_bytes(b"not a checkpoint")
    model = replace(CI_MODEL, checkpoint=str(checkpoint))
    with pytest.raises(FoldmillError, match=r"cpu0@\S+ could not start: .*broken.ckpt: not a PyTorch zip-format") as error:
        fold_targets([protein_item("a", "MKTAYIAKQRQ")], tmp_path, tmp_path / "fold.tsv", model, CI_EXECUTOR, Staging())
    assert "\n" not in str(error.value)
