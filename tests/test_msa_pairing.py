"""Pairing per-chain MSAs of a complex (OSS Boltz-2's row plan, hand-checked on small cases):
paired rows by key, then unpaired rows that never repeat a paired-block row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from foldmill.msa.pairing import GAP_ROW, pair_msas, paired_msa_arrays
from foldmill.msa.parse import read_msa
from foldmill.msa.types import MSA


def make_msa(query: str, rows: list[tuple[str, str]]) -> MSA:
    """An MSA from (aligned row, key) pairs after the query."""
    texts = [query] + [text for text, _ in rows]
    residues = np.stack([np.frombuffer(t.encode(), dtype=np.uint8) for t in texts])
    deletions = np.arange(residues.size, dtype=np.int32).reshape(residues.shape) % 3
    return MSA(residues, deletions, np.array([""] + [key for _, key in rows]))


def assert_unpaired_rows_are_new(plan, msas) -> None:
    """Rows of the unpaired block are used once, and never rows already in the paired block."""
    for chain, msa in enumerate(msas):
        head = plan.rows[: plan.n_paired, chain]
        tail = plan.rows[plan.n_paired :, chain]
        tail = tail[tail != GAP_ROW]
        fills = head[~plan.is_paired[: plan.n_paired, chain] & (head != GAP_ROW)]
        assert len(set(tail.tolist())) == len(tail), f"chain {chain} repeats an unpaired row"
        assert not set(tail.tolist()) & set(head.tolist()), f"chain {chain} reuses a paired-block row"
        assert len(set(fills.tolist())) == len(fills), f"chain {chain} repeats a fill row"
        assert plan.rows[:, chain].max() < msa.depth


def test_pairs_by_key_then_stacks_the_rest() -> None:
    a = make_msa("AAAA", [("AAAC", "taxid:1"), ("AACC", "taxid:2"), ("ACCC", ""), ("CCCC", "taxid:3")])
    b = make_msa("GGG", [("GGT", "taxid:2"), ("GTT", "taxid:1"), ("TTT", "taxid:9"), ("GGA", "taxid:1")])
    plan = pair_msas([a, b])
    # taxid:1 (first seen) gives two rows, b's two hits, a's single hit cycled; then taxid:2.
    # taxid:3 and taxid:9 occur once: those rows stay unpaired.
    assert plan.n_paired == 4
    assert plan.rows[:4].tolist() == [[0, 0], [1, 2], [1, 4], [2, 1]]
    assert plan.is_paired[:4].all()
    # unpaired: a's rows 3, 4 and b's row 3, stacked by index
    assert plan.rows[4:].tolist() == [[3, 3], [4, GAP_ROW]]
    assert not plan.is_paired[4:].any()
    assert_unpaired_rows_are_new(plan, [a, b])


def test_key_shared_by_more_chains_comes_first_and_absent_chains_get_fill_rows() -> None:
    a = make_msa("AA", [("AC", "taxid:1"), ("CC", "taxid:2")])
    b = make_msa("GG", [("GT", "taxid:2"), ("TT", "taxid:1")])
    c = make_msa("KK", [("KR", "taxid:2"), ("RR", "")])
    plan = pair_msas([a, b, c])
    assert plan.rows[1].tolist() == [2, 1, 1]  # taxid:2 in three chains
    assert plan.rows[2].tolist() == [1, 2, 2]  # taxid:1 in two; c fills with its next free row
    assert plan.is_paired[2].tolist() == [True, True, False]
    assert plan.n_paired == 3 and plan.depth == 3  # c's row 2 was used as a fill: not again
    assert_unpaired_rows_are_new(plan, [a, b, c])


def test_single_chain_keeps_its_rows_in_order() -> None:
    a = make_msa("AA", [("AC", "taxid:1"), ("CC", "taxid:1"), ("CA", "")])
    plan = pair_msas([a])
    assert plan.rows[:, 0].tolist() == [0, 1, 2, 3]
    assert plan.n_paired == 3  # a key seen twice groups even within one chain, as in OSS


def test_depth_caps() -> None:
    a = make_msa("AA", [("AC", f"taxid:{i}") for i in range(10)] + [("CC", "")])
    b = make_msa("GG", [("GT", f"taxid:{i}") for i in range(10)])
    plan = pair_msas([a, b], max_paired=4)
    # query + 3 paired rows; keyed rows beyond the cap are not reused as unpaired rows
    assert plan.n_paired == 4 and plan.depth == 5 and plan.rows[4].tolist() == [11, GAP_ROW]
    cut = pair_msas([a, b], max_depth=3)
    assert cut.depth == 3 and cut.n_paired == 3
    assert_unpaired_rows_are_new(plan, [a, b])
    with pytest.raises(ValueError):
        pair_msas([])


def test_real_msa_pairing_uses_taxonomy_and_never_repeats_rows(data_dir: Path) -> None:
    hemoglobin = read_msa(data_dir / "msas" / "1a00_A_uniref90.a3m")
    # A second chain: the same family, every other row, so keys are shared but not row for row.
    other = hemoglobin.select_rows(np.r_[0, np.arange(1, hemoglobin.depth, 2)])
    plan = pair_msas([hemoglobin, other])
    assert plan.n_paired > 100
    assert plan.depth <= 16384
    assert_unpaired_rows_are_new(plan, [hemoglobin, other])
    paired = plan.rows[1 : plan.n_paired]
    both = (paired != GAP_ROW).all(axis=1)
    keys_a = hemoglobin.keys[paired[both, 0]]
    keys_b = other.keys[paired[both, 1]]
    assert (keys_a == keys_b).all() and (keys_a != "").all()
    # every row of each chain is placed (depth allows it): nothing lost
    assert set(plan.rows[:, 0].tolist()) - {GAP_ROW} == set(range(hemoglobin.depth))

    residues, deletions, is_paired = paired_msa_arrays([hemoglobin, other], plan)
    assert residues.shape == (plan.depth, hemoglobin.length * 2)
    row = plan.n_paired  # first unpaired row
    expected = hemoglobin.residues[plan.rows[row, 0]] if plan.rows[row, 0] != GAP_ROW else ord("-")
    np.testing.assert_array_equal(residues[row, : hemoglobin.length], expected)
    assert deletions.sum() > 0 and is_paired[: plan.n_paired].any() and not is_paired[plan.n_paired :].any()


def test_homodimer_pairs_each_row_with_itself(data_dir: Path) -> None:
    msa = read_msa(data_dir / "msas" / "1a00_A_uniref90.a3m", max_depth=300)
    plan = pair_msas([msa, msa])
    paired = plan.rows[: plan.n_paired]
    assert (paired[:, 0] == paired[:, 1]).all()
    assert_unpaired_rows_are_new(plan, [msa, msa])
