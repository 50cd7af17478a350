"""`foldmill bench throughput`'s planning part on CPU: the fixed worklist, its inputs, the OSS command."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from foldmill.bench._synthetic import AMINO_ACID_FREQUENCIES, AMINO_ACIDS, random_protein
from foldmill.bench.throughput import (
    check_boltz_cache, earlier_foldmill_row, idle_between_targets, oss_command, oss_timeline, sample_targets,
    synthetic_worklist, timeline, write_inputs, write_report,
)  # fmt: skip
from foldmill.errors import FoldmillError
from foldmill.executor.records import Journal, TargetRecord, journal_path
from foldmill.executor.transfer import pack_features, unpack_features
from foldmill.io.worklist import build_worklist
from foldmill.msa.parse import read_msa


def test_fixed_worklist_is_seeded_two_chain_and_in_range() -> None:
    first = synthetic_worklist(200, seed=7, min_length=200, max_length=2800)
    assert first == synthetic_worklist(200, seed=7, min_length=200, max_length=2800)
    assert first != synthetic_worklist(200, seed=8, min_length=200, max_length=2800)
    lengths = np.array([t.residues for t in first])
    assert lengths.min() >= 200 and lengths.max() <= 2800 and lengths.std() > 500  # spread over the range
    assert all(len(t.sequences) == 2 and min(map(len, t.sequences)) >= 50 for t in first)
    sample = sample_targets(first, 20, seed=7)
    assert sample == sample_targets(first, 20, seed=7) and len(set(t.target_id for t in sample)) == 20
    assert sample_targets(first, 0, seed=7) == first
    capped = sample_targets(first, 6, seed=7, max_length=1000)
    assert len(capped) == 6 and all(t.residues <= 1000 for t in capped)
    eligible = [t for t in first if t.residues <= 1000]
    assert set(t.target_id for t in capped) <= set(t.target_id for t in eligible)
    assert capped != eligible[:6]  # a shuffled sample of those, not the first 6
    assert set(t.target_id for t in sample_targets(first, 3, seed=7, max_length=1000)) <= set(t.target_id for t in capped)
    with pytest.raises(FoldmillError, match="at most 150 residues"):
        sample_targets(first, 3, seed=7, max_length=150)


def test_random_proteins_are_the_letters_numpy_choice_draws_from_the_same_stream() -> None:
    """The benchmark's fixed worklist stays the same worklist: same letters, same stream after."""
    fast, reference = np.random.default_rng(11), np.random.default_rng(11)
    for length in (1, 7, 2800):
        expected = "".join(reference.choice(AMINO_ACIDS, size=length, p=AMINO_ACID_FREQUENCIES))
        assert random_protein(length, fast) == expected
    assert fast.random() == reference.random()


def test_stratified_sample_takes_one_target_per_length_stratum() -> None:
    worklist = synthetic_worklist(300, seed=0, min_length=200, max_length=2800)
    sample = sample_targets(worklist, 4, seed=0, stratified=True)
    assert sample == sample_targets(worklist, 4, seed=0, stratified=True)
    lengths = [t.residues for t in worklist]
    low, width = min(lengths), (max(lengths) + 1 - min(lengths)) / 4
    strata = sorted(int((t.residues - low) // width) for t in sample)
    assert strata == [0, 1, 2, 3]  # one per quarter of the range
    # Each is the first target of the seeded shuffle in its stratum: the plain sample's order.
    shuffled = sample_targets(worklist, 0, seed=0)
    order = {t.target_id: i for i, t in enumerate(np.array(worklist, dtype=object)[np.random.default_rng(1).permutation(300)])}
    for target in sample:
        stratum = int((target.residues - low) // width)
        rivals = [t for t in shuffled if int((t.residues - low) // width) == stratum]
        assert order[target.target_id] == min(order[t.target_id] for t in rivals)
    capped = sample_targets(worklist, 3, seed=0, max_length=1000, stratified=True)
    assert len(capped) == 3 and all(t.residues <= 1000 for t in capped)


def test_a_split_comparison_reads_the_earlier_foldmill_row(tmp_path: Path) -> None:
    """`--side oss` after `--side foldmill` with the same --out: the foldmill row comes from its table."""
    assert earlier_foldmill_row(tmp_path) == []
    args = argparse.Namespace(recycling_steps=3, sampling_steps=200, diffusion_samples=5, sample_max_length=0,
                              stratified=True, targets=10, min_length=200, max_length=2800, seed=0, msa_depth=8,
                              model="demo-full", device="cuda")  # fmt: skip
    row = {"system": "foldmill", "targets": 2, "written": 2, "residues": 900, "wall_s": 30.0, "gpus": 1,
           "residues_per_gpu_hour": 108000.0}  # fmt: skip
    sample = synthetic_worklist(2, seed=0, min_length=400, max_length=500)
    write_report(tmp_path, args, [row], "summary", sample)
    assert "one per length stratum" in (tmp_path / "throughput.md").read_text()
    (earlier,) = earlier_foldmill_row(tmp_path)
    assert earlier["residues"] == 900 and earlier["residues_per_gpu_hour"] == 108000.0 and "ratio_vs_oss" not in earlier


def test_inputs_are_boltz_yaml_with_msas_of_the_requested_depth(tmp_path: Path) -> None:
    targets = synthetic_worklist(3, seed=0, min_length=40, max_length=80)
    inputs = write_inputs(targets, tmp_path / "inputs", msa_depth=16, seed=0)
    assert all(path.suffix == ".yaml" for path in inputs.iterdir())  # OSS refuses anything else there
    worklist = build_worklist([inputs])
    assert worklist.table["target_id"].tolist() == [t.target_id for t in targets]
    assert worklist.table["n_tokens"].tolist() == [t.residues for t in targets]
    deletions = 0
    for target in targets:
        for chain, sequence in zip("AB", target.sequences):
            msa = read_msa(tmp_path / "inputs.msa" / f"{target.target_id}_{chain}.a3m", sequence)
            assert msa.depth == 16 and msa.length == len(sequence)
            assert (msa.residues[1:] != msa.residues[0]).mean() > 0.1  # homologs, not copies of the query
            deletions += int((msa.deletions > 0).sum())
    assert deletions > 0  # insertions exercise the deletion features


def test_oss_side_runs_the_same_recipe_on_the_same_inputs(tmp_path: Path) -> None:
    args = argparse.Namespace(
        boltz_cache=tmp_path / "cache", device="cuda", recycling_steps=3, sampling_steps=200, diffusion_samples=5,
        max_parallel_samples=5, seed=0, cpu_workers=6,
    )  # fmt: skip
    command = oss_command(tmp_path / "inputs", tmp_path / "oss", args, tmp_path / "boltz2_conf.ckpt", gpus=1)
    assert command[2:5] == ["boltz.main", "predict", str(tmp_path / "inputs")] and command[-1] == "--override"
    flags = dict(zip(command[5:-1:2], command[6:-1:2]))
    assert flags["--recycling_steps"] == "3" and flags["--sampling_steps"] == "200"
    assert flags["--diffusion_samples"] == "5" and flags["--checkpoint"] == str(tmp_path / "boltz2_conf.ckpt")
    assert flags["--accelerator"] == "gpu" and flags["--devices"] == "1" and flags["--output_format"] == "mmcif"
    assert flags["--num_workers"] == "6" and flags["--preprocessing-threads"] == "6"
    # offline, unsteered (the model has no potentials), OSS's own cuEquivariance kernels on
    assert not {"--use_msa_server", "--use_potentials", "--no_kernels"} & set(command)


def test_boltz_cache_must_hold_mols_and_non_empty_checkpoints(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(FoldmillError, match="mols/"):
        check_boltz_cache(cache)
    (cache / "mols").mkdir(parents=True)
    (cache / "boltz2_conf.ckpt").write_bytes(b"x")
    (cache / "boltz2_aff.ckpt").write_bytes(b"")
    with pytest.raises(FoldmillError, match="boltz2_aff.ckpt is missing or empty"):
        check_boltz_cache(cache)
    (cache / "boltz2_aff.ckpt").write_bytes(b"x")
    assert check_boltz_cache(cache) == cache


def test_oss_timeline_reads_when_each_target_was_written(tmp_path: Path) -> None:
    targets = synthetic_worklist(3, seed=0, min_length=40, max_length=80)
    results = tmp_path / "oss" / "boltz_results_inputs"
    (results / "processed").mkdir(parents=True)
    (results / "processed" / "manifest.json").write_text("{}")
    os.utime(results / "processed" / "manifest.json", (1005.0, 1005.0))
    for target, written in zip(targets[:2], (1030.0, 1020.0)):  # the third was never written
        model = results / "predictions" / target.target_id / f"{target.target_id}_model_0.cif"
        model.parent.mkdir(parents=True)
        model.write_text("data_x\n")
        os.utime(model, (written, written))
    frame = oss_timeline(tmp_path / "oss", tmp_path / "inputs", targets, started=1000.0)
    assert frame["target_id"].tolist() == ["(preprocessing)", targets[1].target_id, targets[0].target_id]
    assert frame["written_s"].tolist() == [5.0, 20.0, 30.0]
    assert frame["residues"].tolist() == [0, targets[1].residues, targets[0].residues]


def test_timeline_and_idle_share_come_from_the_journal(tmp_path: Path) -> None:
    table = tmp_path / "fold" / "fold.tsv"
    with Journal(journal_path(table)) as journal:
        for target, replica, start, end in (("a", "gpu0@n", 100.0, 110.0), ("b", "gpu0@n", 111.0, 120.0),
                                            ("c", "gpu1@n", 100.5, 120.0)):  # fmt: skip
            journal.append(TargetRecord(target, "ok", "", 500, end - start, replica, fold_started=start,
                                        fold_finished=end, model_stages={"trunk": 1.0, "diffusion": 2.0}))  # fmt: skip
        journal.append(TargetRecord("d", "failed", "featurize: bad", 10))
    frame = timeline(table)
    assert frame["target_id"].tolist() == ["a", "b", "c"]
    assert frame["fold_start_s"].tolist() == [0.0, 11.0, 0.5]
    assert {"model_trunk_s", "model_diffusion_s"} <= set(frame.columns)
    assert idle_between_targets(frame) == pytest.approx(1.0 / (20.0 + 19.5))  # one 1 s gap on gpu0


def test_sparse_tensors_that_are_not_one_hot_are_packed_exactly() -> None:
    """The one-hot test that keeps disto_target small on its way to the GPU must not take a sparse
    tensor with two 1s in a row, or a value other than 1, for one-hot."""
    two_in_a_row = torch.zeros(3, 4, 64)
    two_in_a_row[1, 2, 5] = two_in_a_row[1, 2, 9] = 1.0
    a_two = torch.zeros(5, 32, dtype=torch.int64)
    a_two[4, 3] = 2
    vector = torch.zeros(64)
    vector[17] = 1.0
    for tensor, kind in ((two_in_a_row, "raw"), (a_two, "narrow"), (vector, "one_hot")):
        packed = pack_features({"x": tensor})["x"]
        assert packed.kind == kind
        back = unpack_features({"x": packed}, torch.device("cpu"))["x"]
        assert back.dtype == tensor.dtype and torch.equal(back, tensor)
