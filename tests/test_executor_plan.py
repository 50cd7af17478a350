"""Executor pieces that need no Ray: planning, resume matching, budget, records, fault classes, progress."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from foldmill.errors import FoldmillError, is_out_of_memory
from foldmill.executor.faults import TargetRejected, classify, is_sticky_cuda_error
from foldmill.executor.plan import WorkItem, lead_with_small_targets, over_budget, plan_run
from foldmill.executor.progress import Progress, summary_text
from foldmill.executor.records import Journal, TargetRecord, journal_path, write_fold_table
from foldmill.executor.settings import executor_settings, model_settings
from foldmill.executor.transfer import pack_features, unpack_features
from foldmill.features import featurize
from foldmill.io.targets import Entity, Target
from foldmill.io.worklist import build_worklist
from foldmill.outputs.summary import read_fold_table
from foldmill.outputs.validation import InvalidPrediction
from foldmill.outputs.writer import DONE_MARKER, record_name, target_dir

PROVENANCE = {"model": "demo", "seed": 0, "recipe": {"recycling_steps": 0, "sampling_steps": 2, "diffusion_samples": 1}}


def item(target_id: str, tokens: int, content_hash: str = "h") -> WorkItem:
    return WorkItem(target_id, tokens, content_hash, "{}")


def finish(outdir: Path, target_id: str, provenance: dict) -> None:
    """A finished target directory as the writer leaves it (record + done marker)."""
    directory = target_dir(outdir, target_id)
    directory.mkdir(parents=True)
    (directory / record_name(target_id)).write_text(json.dumps({"provenance": provenance}))
    (directory / DONE_MARKER).write_text("")


def test_plan_orders_longest_first_and_keeps_input_order_for_ties(tmp_path: Path) -> None:
    items = [item("a", 10), item("b", 300), item("c", 10), item("d", 50)]
    plan = plan_run(items, tmp_path, PROVENANCE)
    assert [i.target_id for i in plan.todo] == ["b", "d", "a", "c"]
    assert plan.finished == []


def test_the_smallest_targets_lead_so_replicas_start_without_waiting_for_large_features() -> None:
    todo = [item(f"t{tokens}", tokens) for tokens in range(2000, 0, -100)]  # 20 targets, longest first
    names = [i.target_id for i in lead_with_small_targets(todo, replicas=2)]  # two per replica, smallest first
    assert names == ["t100", "t200", "t300", "t400"] + [f"t{tokens}" for tokens in range(2000, 400, -100)]
    names = [i.target_id for i in lead_with_small_targets(todo[:8], replicas=2)]  # at most a quarter
    assert names == ["t1300", "t1400"] + [f"t{tokens}" for tokens in range(2000, 1400, -100)]
    assert lead_with_small_targets(todo[:3], replicas=1) == todo[:3]  # a short list stays longest first


def test_plan_skips_only_targets_finished_with_the_same_inputs_and_settings(tmp_path: Path) -> None:
    finish(tmp_path, "same", {**PROVENANCE, "content_hash": "h", "device": "cpu"})
    finish(tmp_path, "edited", {**PROVENANCE, "content_hash": "old"})
    finish(tmp_path, "other_recipe", {**PROVENANCE, "recipe": {"sampling_steps": 200}, "content_hash": "h"})
    target_dir(tmp_path, "half").mkdir(parents=True)  # no done marker: an unfinished write
    items = [item(name, 10) for name in ("same", "edited", "other_recipe", "half", "new")]
    plan = plan_run(items, tmp_path, PROVENANCE)
    assert [i.target_id for i in plan.finished] == ["same"]
    assert sorted(i.target_id for i in plan.todo) == ["edited", "half", "new", "other_recipe"]


def test_an_id_predicted_from_other_content_of_another_file_is_refused_with_both_sources(tmp_path: Path) -> None:
    earlier = {**PROVENANCE, "content_hash": "old", "input_source": "a.fasta", "input_record": "record 2"}
    for name in ("reused", "edited", "unknown_origin"):
        finish(tmp_path, name, earlier)

    def sourced(target_id: str, source: str) -> WorkItem:
        return WorkItem(target_id, 10, "new", json.dumps({"source": source, "record": "record 1"}))

    items = [sourced("reused", "b.fasta"), sourced("edited", "a.fasta"), item("unknown_origin", 10, "new")]
    plan = plan_run(items, tmp_path, PROVENANCE)
    assert [i.target_id for i in plan.todo] == ["edited", "unknown_origin"]  # an edit of the same input folds again
    [refused] = plan.refused
    assert (refused.target_id, refused.status) == ("reused", "rejected")
    both = "already predicted from different content, from a.fasta: record 2 (this one: b.fasta: record 1)"
    assert both in refused.reason


def test_plan_without_a_predictions_directory_folds_everything(tmp_path: Path) -> None:
    assert [i.target_id for i in plan_run([item("a", 10)], tmp_path / "absent", PROVENANCE).todo] == ["a"]
    (tmp_path / "predictions").write_text("not a directory")
    plan = plan_run([item("a", 10), item("b", 20)], tmp_path, PROVENANCE)
    assert [i.target_id for i in plan.todo] == ["b", "a"] and not plan.finished


def test_token_budget_rejects_with_a_clear_reason() -> None:
    fit, rejected = over_budget([item("small", 100), item("huge", 5000)], 2048)
    assert [i.target_id for i in fit] == ["small"]
    assert [(r.target_id, r.status, r.n_tokens) for r in rejected] == [("huge", "rejected", 5000)]
    assert "5000 tokens exceed the token budget of 2048" in rejected[0].reason


def test_journal_survives_a_cut_line_and_keeps_the_latest_record(tmp_path: Path) -> None:
    table = tmp_path / "fold" / "shard_0000.tsv"
    path = journal_path(table)
    with Journal(path) as journal:
        journal.append(TargetRecord("a", "failed", "boom", 10))
        journal.append(TargetRecord("a", "ok", "", 10, seconds=1.5, replica="cpu0@x"))
        journal.append(TargetRecord("b", "ok", "", 20))
    with path.open("a") as handle:
        handle.write('{"target_id": "c", "status": "o')  # killed mid-line
    records = Journal.read(path)
    assert sorted(records) == ["a", "b"]
    assert records["a"].status == "ok" and records["a"].replica == "cpu0@x"


def test_fold_table_matches_the_contract_read_by_the_summary(tmp_path: Path) -> None:
    table = tmp_path / "fold" / "shard_0000.tsv"
    write_fold_table(
        [TargetRecord("a", "ok", "", 10, 1.25, "gpu0@n", "/p/a"), TargetRecord("b", "rejected", "too big", 9000)], table
    )
    read = read_fold_table(table)
    assert list(read.columns) == ["target_id", "status", "reason", "n_tokens", "seconds", "replica", "prediction_dir"]
    assert read["status"].tolist() == ["ok", "rejected"] and read["reason"].tolist() == ["", "too big"]
    with pytest.raises(ValueError):
        TargetRecord("x", "done")


def test_fault_classes() -> None:
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    sticky = RuntimeError("CUDA error: an illegal memory access was encountered")
    assert is_sticky_cuda_error(sticky) and classify(sticky)[0] == "retire"
    assert classify(InvalidPrediction("t", "non-finite coordinates"))[0:2] == ("rejected", "non-finite coordinates")
    assert classify(TargetRejected("out of memory at 4000 tokens"))[0] == "rejected"
    assert classify(FoldmillError("in.yaml: chain A: bad MSA")) == ("failed", "in.yaml: chain A: bad MSA")
    assert classify(KeyError("x")) == ("failed", "KeyError: 'x'")


def test_settings_from_config_sections() -> None:
    model = model_settings({"checkpoint": "demo", "device": "cpu", "recipe": {"sampling_steps": 5}})
    assert (model.device, model.recipe.sampling_steps, model.recipe.recycling_steps, model.recipe.seed) == ("cpu", 5, 3, 0)
    assert executor_settings({"queue_depth": 4}).queue_depth == 4
    with pytest.raises(FoldmillError, match="unknown key"):
        executor_settings({"queue_dept": 4})
    with pytest.raises(FoldmillError, match="sampling_steps"):
        model_settings({"checkpoint": "demo", "recipe": {"sampling_steps": 1}})
    with pytest.raises(FoldmillError, match="model.device"):
        model_settings({"checkpoint": "demo", "device": "tpu"})
    with pytest.raises(FoldmillError, match="model.checkpoint: missing"):
        model_settings({"device": "cpu"})


def test_progress_line_and_summary() -> None:
    stream = io.StringIO()
    progress = Progress(total_targets=3, total_tokens=300, stream=stream)
    assert progress.line().endswith("| models loading")
    progress.start_folding()
    assert progress.line().endswith("| first targets folding")
    progress.record(TargetRecord("a", "ok", "", 200, seconds=2.0, replica="cpu0@x"))
    progress.record(TargetRecord("b", "failed", "featurize: bad", 50))
    line = progress.line()
    assert line.startswith("fold 2/3 targets (1 failed) | 250/300 residues")
    assert "residues/s" in line and "ETA" in line
    records = [TargetRecord("a", "ok", "", 200, 2.0, "cpu0@x"), TargetRecord("b", "failed", "featurize: bad", 50),
               TargetRecord("c", "ok", "", 50, 0.0, "cpu0@x")]  # fmt: skip
    text = summary_text(records, {"c"}, wall_seconds=12.0, fold_seconds=4.0, busy={"cpu0@x": 2.0})
    assert "ok 2 (1 from earlier runs), failed 1, rejected 0" in text
    assert "folded now: 1 targets, 200 residues" in text and "50.0 residues/s" in text
    assert "cpu0@x" in text and " 50%" in text
    assert "failed b: featurize: bad" in text
    assert "180,000 residues per replica-hour" in text


@pytest.mark.parametrize("example", ["msa", "ligand.yaml", "multimer.yaml", "cyclic_prot.yaml"])
def test_packed_features_unpack_exactly_and_travel_small(data_dir: Path, example: str) -> None:
    if example == "msa":  # a protein with a real MSA (its query is row 1 of the A3M)
        msa = data_dir / "msas/seq1.a3m"
        query = msa.read_text().split(">")[1].split("\n", 1)[1].replace("\n", "")
        target = Target("with_msa", (Entity("protein", ("A",), query, msa=str(msa)),))
    else:
        target = build_worklist([data_dir / "boltz_inputs" / example]).targets[0]
    features = featurize(target, seed=0).features
    packed = pack_features(features)
    unpacked = unpack_features(packed, torch.device("cpu"))
    assert unpacked.keys() == features.keys()
    for name, value in features.items():
        assert unpacked[name].dtype == value.dtype and torch.equal(unpacked[name], value), name
    raw_bytes = sum(v.numel() * v.element_size() for v in features.values())
    assert sum(p.nbytes for p in packed.values()) < raw_bytes / 5


def test_every_packing_kind_round_trips() -> None:
    cases = {
        "bool one-hot with empty rows": (torch.tensor([[True, False, False], [False, False, False]]), "one_hot"),
        "float one-hot": (torch.nn.functional.one_hot(torch.tensor([2, 0, 1]), 64).float(), "one_hot"),
        "all zeros": (torch.zeros(2, 5, 5, 64), "zeros"),
        "small integers": (torch.tensor([[-1, 7, 300]]), "narrow"),
        "multi-hot mask": (torch.ones(4, 8, dtype=torch.bool), "raw"),
        "real values": (torch.randn(3, 4), "raw"),
    }
    for name, (tensor, kind) in cases.items():
        packed = pack_features({"x": tensor})["x"]
        assert packed.kind == kind, name
        back = unpack_features({"x": packed}, torch.device("cpu"))["x"]
        assert back.dtype == tensor.dtype and torch.equal(back, tensor), name
