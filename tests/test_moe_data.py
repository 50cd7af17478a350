"""Corpus preparation: tokenizers, FASTA streaming, packing, deterministic split, resumable batches."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from foldmill.errors import FoldmillError, InputError
from foldmill.moe.data.corpus import prepare_corpus, split_of
from foldmill.moe.data.fasta import iter_fasta
from foldmill.moe.data.loader import BatchSampler, PackedWindows
from foldmill.moe.data.tokenizers import BOS, EOS, TOKENIZERS


def test_tokenizers_encode_decode_and_reject():
    protein = TOKENIZERS["protein"]
    ids = protein.encode("mkvA*")
    assert ids[0] == BOS and ids[-1] == EOS and protein.decode(ids) == "MKVA"
    with pytest.raises(ValueError, match="'1' at position 3"):
        protein.encode("MK1A")
    dna = TOKENIZERS["nucleotide"]
    assert dna.decode(dna.encode("acguRY")) == "ACGTNN"
    assert dna.vocab_size == 9 and protein.vocab_size == 29


def test_fasta_reader_streams_gzip_and_reports_bad_files(tmp_path):
    path = tmp_path / "x.fa.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(">a desc\nACGT\nAC\n\n>b\nGG\n")
    assert list(iter_fasta(path)) == [("a", "ACGTAC"), ("b", "GG")]
    bad = tmp_path / "bad.fa"
    bad.write_text("ACGT\n>a\nAC\n")
    with pytest.raises(InputError, match="bad.fa: line 1: sequence before the first"):
        list(iter_fasta(bad))


def test_prepare_corpus_packs_splits_and_rejects(tmp_path, data_dir):
    proteome = data_dir / "proteomes/yeast_chr1.fasta"
    extra = tmp_path / "extra.fasta"
    extra.write_text(">bad1\nMK?L\n>ok1\nMKLV\n")
    meta = prepare_corpus([proteome, extra], tmp_path / "c", val_fraction=0.1, shard_tokens=10000)
    records = {r for r, _ in iter_fasta(proteome)} | {"ok1"}
    splits = meta["splits"]
    assert splits["train"]["records"] + splits["val"]["records"] == len(records) == 95
    assert meta["rejected_records"] == 1
    assert "bad1\tcharacter '?' at position 3 is not protein" in (tmp_path / "c/rejects.tsv").read_text()
    expected_val = {r for r in records if split_of(r, 0.1) == "val"}
    assert splits["val"]["records"] == len(expected_val) > 0
    streams = {s: np.concatenate([np.load(tmp_path / "c" / n) for n in splits[s]["shards"]]) for s in splits}
    assert all(np.load(tmp_path / "c" / n).size <= 10000 for s in splits for n in splits[s]["shards"])
    assert sum(v.size for v in streams.values()) == sum(len(seq) + 2 for r, seq in iter_fasta(proteome)) + 6
    assert int((streams["val"] == BOS).sum()) == len(expected_val)
    # the split depends on record ids only, not on file order
    again = prepare_corpus([extra, proteome], tmp_path / "d", val_fraction=0.1, shard_tokens=10000)
    assert again["splits"]["val"]["tokens"] == splits["val"]["tokens"]
    assert json.loads((tmp_path / "c/meta.json").read_text()) == meta


def test_prepare_corpus_without_usable_records_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.fasta"
    bad.write_text(">x\n1234\n")
    with pytest.raises(InputError, match="no usable protein sequence; first reject: x"):
        prepare_corpus([bad], tmp_path / "c")
    with pytest.raises(FoldmillError, match="unknown alphabet"):
        prepare_corpus([bad], tmp_path / "c", alphabet="rna")


def test_prepare_corpus_with_nothing_left_to_train_on_says_so(tmp_path):
    """One usable record goes to validation, which is never left empty: the error names that, not
    the reject beside it, and writes nothing."""
    few = tmp_path / "few.fasta"
    few.write_text(">a\nMKVLAAGGHHKKLLPPWWYYEE\n>b\nMK1V\n")
    with pytest.raises(InputError, match=r"1 usable protein sequence, all held out for validation "
                                         r"\(val_fraction 0.05\): none left to train on; first reject: b"):
        prepare_corpus([few], tmp_path / "c")
    assert not (tmp_path / "c").exists()
    # Without a validation split the same record trains.
    assert prepare_corpus([few], tmp_path / "c", val_fraction=0.0)["splits"]["train"]["records"] == 1


def test_prepare_corpus_replaces_only_a_corpus_it_wrote(tmp_path, data_dir):
    proteome = data_dir / "proteomes/yeast_chr1.fasta"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "meta.json").write_text("my notes\n")
    with pytest.raises(FoldmillError, match=r"mine: holds files foldmill prepare-corpus did not write "
                                            r"\(e.g. meta.json\); nothing was written"):
        prepare_corpus([proteome], mine)
    assert [path.name for path in mine.iterdir()] == ["meta.json"]
    assert (mine / "meta.json").read_text() == "my notes\n"
    # a rerun replaces its own corpus as a whole: no shard of the larger earlier corpus stays behind
    corpus = tmp_path / "c"
    prepare_corpus([proteome], corpus, val_fraction=0.1, shard_tokens=10000)
    meta = prepare_corpus([proteome], corpus, val_fraction=0.1, shard_tokens=100000)
    shards = [name for split in meta["splits"].values() for name in split["shards"]]
    assert sorted(path.name for path in corpus.iterdir()) == sorted(
        [".foldmill-prepare-corpus", "meta.json", "rejects.tsv", *shards])
    # a failed rerun keeps the corpus there
    bad = tmp_path / "bad.fasta"
    bad.write_text(">x\n1234\n")
    with pytest.raises(InputError):
        prepare_corpus([bad], corpus)
    assert json.loads((corpus / "meta.json").read_text()) == meta


def test_prepare_corpus_replaces_a_corpus_written_before_its_ledger(tmp_path, data_dir):
    proteome = data_dir / "proteomes/yeast_chr1.fasta"
    corpus = tmp_path / "c"
    prepare_corpus([proteome], corpus, val_fraction=0.1, shard_tokens=10000)
    (corpus / ".foldmill-prepare-corpus").unlink()
    assert prepare_corpus([proteome], corpus, val_fraction=0.2)["val_fraction"] == 0.2
    (corpus / ".foldmill-prepare-corpus").unlink()
    (corpus / "notes.txt").write_text("mine\n")  # not a corpus file: the directory is not one of ours
    with pytest.raises(FoldmillError, match="did not write"):
        prepare_corpus([proteome], corpus)
    assert (corpus / "notes.txt").read_text() == "mine\n"


def test_windows_and_sampler_resume_exactly(tmp_path, data_dir):
    prepare_corpus([data_dir / "proteomes/yeast_chr1.fasta"], tmp_path, shard_tokens=8000)
    windows = PackedWindows(tmp_path, "train", 64)
    batch = windows.batch(np.array([0, 1]))
    assert batch.shape == (2, 65) and np.array_equal(batch[0, -1].numpy(), batch[1, 0].numpy())
    sampler = BatchSampler(len(windows), 7, seed=3)
    for _ in range(len(windows) // 7 + 3):  # run past an epoch boundary
        sampler.next_indices()
    resumed = BatchSampler(len(windows), 7, seed=3)
    resumed.load_state_dict(sampler.state_dict())
    assert all(np.array_equal(sampler.next_indices(), resumed.next_indices()) for _ in range(5))
    ranks = [BatchSampler(len(windows), 4, seed=3, rank=r, world_size=2).next_indices() for r in (0, 1)]
    assert not set(ranks[0]) & set(ranks[1])
    with pytest.raises(FoldmillError, match="no window of 100001 tokens"):
        PackedWindows(tmp_path, "val", 100000)
