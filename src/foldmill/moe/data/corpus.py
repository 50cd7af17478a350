"""FASTA corpora -> tokenized, packed, sharded token streams with a deterministic train/val split.

Layout of a corpus directory:
  meta.json            tokenizer, vocab size, per split: shard files, tokens, records
  train_00000.npy ...  uint8 token ids, records packed back to back (<bos> seq <eos> <bos> ...)
  val_00000.npy ...
  rejects.tsv          records that could not be tokenized (source, record, problem)
A record goes to validation when the hash of its id falls below `val_fraction`, so the split does
not depend on file order and a record never moves between splits when more data is added.

The directory is written as a whole and replaces an earlier corpus only (its ledger; a corpus
written before the ledger existed is recognised by its meta.json and file names): a directory
holding anything else is refused before anything is written, and an interrupted run keeps the
earlier corpus.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from foldmill.errors import FoldmillError, InputError
from foldmill.io.atomic import adopt_earlier, owned_directory, write_text_atomic
from foldmill.moe.data.fasta import iter_fasta
from foldmill.moe.data.tokenizers import TOKENIZERS

log = logging.getLogger(__name__)
SPLITS = ("train", "val")
FORMAT = "foldmill-moe-corpus/1"
COMMAND = "prepare-corpus"  # the owner named in the corpus directory's ledger
CORPUS_FILE = re.compile(r"(meta\.json|rejects\.tsv|(train|val)_\d{5}\.npy)")


def record_rank(record: str) -> float:
    """A uniform number in [0, 1) fixed by the record id."""
    return int.from_bytes(hashlib.sha1(record.encode("utf-8")).digest()[:8], "big") / 2**64


def split_of(record: str, val_fraction: float) -> str:
    """'val' for a deterministic fraction of record ids, else 'train'."""
    return "val" if record_rank(record) < val_fraction else "train"


@dataclass
class _ShardWriter:
    out_dir: Path
    split: str
    shard_tokens: int
    buffer: list[np.ndarray] = field(default_factory=list)
    buffered: int = 0
    shards: list[str] = field(default_factory=list)
    tokens: int = 0
    records: int = 0

    def add(self, ids: np.ndarray) -> None:
        self.buffer.append(ids)
        self.buffered += ids.size
        self.records += 1
        while self.buffered >= self.shard_tokens:
            stream = np.concatenate(self.buffer)
            self._write(stream[: self.shard_tokens])
            rest = stream[self.shard_tokens :]
            self.buffer, self.buffered = ([rest] if rest.size else []), rest.size

    def close(self) -> None:
        if self.buffered:
            self._write(np.concatenate(self.buffer))
            self.buffer, self.buffered = [], 0

    def _write(self, stream: np.ndarray) -> None:
        name = f"{self.split}_{len(self.shards):05d}.npy"
        with open(self.out_dir / name, "wb") as handle:  # a staging directory (prepare_corpus)
            np.save(handle, stream, allow_pickle=False)
        self.shards.append(name)
        self.tokens += stream.size


def prepare_corpus(
    fasta_paths: Sequence[str | Path],
    out_dir: str | Path,
    alphabet: str = "protein",
    val_fraction: float = 0.05,
    shard_tokens: int = 1 << 26,
    min_length: int = 1,
) -> dict:
    """Tokenize and pack the FASTA files into `out_dir`; returns the metadata written to meta.json."""
    if alphabet not in TOKENIZERS:
        raise FoldmillError(f"unknown alphabet {alphabet!r}; choose one of {', '.join(TOKENIZERS)}")
    if not 0.0 <= val_fraction < 1.0:
        raise FoldmillError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if shard_tokens < 1:  # a shard of no tokens would be written forever
        raise FoldmillError(f"shard_tokens must be >= 1, got {shard_tokens}")
    out_dir = Path(out_dir)
    adopt_earlier(out_dir, COMMAND, _is_earlier_corpus)
    with owned_directory(out_dir, COMMAND) as staging:
        meta = _write_corpus(fasta_paths, staging, alphabet, val_fraction, shard_tokens, min_length)
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    log.info("corpus %s: %d train / %d val records (%d / %d tokens), %d rejected", out_dir, train["records"],
             val["records"], train["tokens"], val["tokens"], meta["rejected_records"])
    return meta


def _is_earlier_corpus(out_dir: Path, entries: list[str]) -> bool:
    """Whether `out_dir`, without a ledger, holds a corpus this command wrote before it kept one."""
    try:
        meta = json.loads((out_dir / "meta.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT and all(CORPUS_FILE.fullmatch(n) for n in entries)


def _write_corpus(fasta_paths: Sequence[str | Path], out_dir: Path, alphabet: str, val_fraction: float,
                  shard_tokens: int, min_length: int) -> dict:
    """The corpus files in `out_dir`; returns meta.json's contents."""
    tokenizer = TOKENIZERS[alphabet]
    writers = {split: _ShardWriter(out_dir, split, shard_tokens) for split in SPLITS}
    rejects: list[tuple[str, str, str]] = []
    # The record that would go to validation first, kept back so validation is never empty.
    fallback: tuple[float, str, np.ndarray] | None = None
    for path in fasta_paths:
        for record, sequence in iter_fasta(path):
            try:
                if len(sequence) < min_length:
                    raise ValueError(f"sequence shorter than {min_length}")
                ids = tokenizer.encode(sequence)
            except ValueError as error:
                rejects.append((str(path), record, str(error)))
                continue
            split = split_of(record, val_fraction)
            if split == "train" and val_fraction > 0 and not writers["val"].records:
                # Hold back the lowest-ranked training record until we know validation got one.
                rank = record_rank(record)
                if fallback is None or rank < fallback[0]:
                    if fallback is not None:
                        writers["train"].add(fallback[2])
                    fallback = (rank, record, ids)
                    continue
            writers[split].add(ids)
    if fallback is not None:
        writers["val" if not writers["val"].records else "train"].add(fallback[2])
    for writer in writers.values():
        writer.close()
    if not writers["train"].tokens:
        usable = writers["val"].records  # validation takes a record before training does
        problem = (f"{usable} usable {alphabet} sequence{'s' if usable > 1 else ''}, all held out for validation "
                   f"(val_fraction {val_fraction}): none left to train on" if usable
                   else f"no usable {alphabet} sequence")
        first = f"; first reject: {rejects[0][1]}: {rejects[0][2]}" if rejects else ""
        raise InputError(", ".join(map(str, fasta_paths)), None, problem + first)
    rejects_text = "source\trecord\tproblem\n" + "".join(f"{s}\t{r}\t{p}\n" for s, r, p in rejects)
    write_text_atomic(out_dir / "rejects.tsv", rejects_text)
    meta = {
        "format": FORMAT,
        "tokenizer": alphabet,
        "vocab_size": tokenizer.vocab_size,
        "val_fraction": val_fraction,
        "rejected_records": len(rejects),
        "splits": {s: {"shards": w.shards, "tokens": w.tokens, "records": w.records} for s, w in writers.items()},
    }
    write_text_atomic(out_dir / "meta.json", json.dumps(meta, indent=2) + "\n")
    return meta


def alphabet_mismatch(corpus_dir: str | Path, meta: dict, vocab_size: int) -> str | None:
    """Why a checkpoint's model of `vocab_size` token types cannot read this corpus (`meta`, its
    meta.json), or None."""
    if meta["vocab_size"] == vocab_size:
        return None
    trained = next((name for name, tokenizer in TOKENIZERS.items() if tokenizer.vocab_size == vocab_size), None)
    model = f"the {trained} alphabet ({vocab_size} token types)" if trained else f"{vocab_size} token types"
    return (f"its model reads {model} and {corpus_dir} is a {meta['tokenizer']} corpus ({meta['vocab_size']}): "
            f"use a corpus of the alphabet it was trained on")


def load_meta(corpus_dir: str | Path) -> dict:
    path = Path(corpus_dir) / "meta.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise FoldmillError(f"{path}: not a prepared corpus ({error}); run `foldmill pretrain prepare-corpus`") from None
    if meta.get("format") != FORMAT:
        raise FoldmillError(f"{path}: unknown corpus format {meta.get('format')!r}")
    return meta
