"""`foldmill bench throughput`'s planning part on CPU: the fixed worklist, its inputs, the OSS command."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from foldmill.bench.throughput import (
    idle_between_targets, oss_command, sample_targets, synthetic_worklist, timeline, write_inputs,
)  # fmt: skip
from foldmill.executor.records import Journal, TargetRecord, journal_path
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
        max_parallel_samples=5, seed=0,
    )  # fmt: skip
    command = oss_command(tmp_path / "inputs", tmp_path / "oss", args, tmp_path / "boltz2_conf.ckpt", gpus=1)
    flags = dict(zip(command[5::2], command[6::2]))
    assert command[2:5] == ["boltz.main", "predict", str(tmp_path / "inputs")]
    assert flags["--recycling_steps"] == "3" and flags["--sampling_steps"] == "200"
    assert flags["--diffusion_samples"] == "5" and flags["--checkpoint"] == str(tmp_path / "boltz2_conf.ckpt")
    assert flags["--accelerator"] == "gpu" and flags["--devices"] == "1"


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
