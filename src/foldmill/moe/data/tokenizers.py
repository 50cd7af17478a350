"""Character tokenizers for protein and nucleotide sequences.

Ids 0-3 are <pad>, <bos>, <eos>, <unk>; letters follow. Each record is encoded as
<bos> sequence <eos>. Input is case-insensitive; a terminal stop '*' of a protein is dropped;
for nucleotides U reads as T and IUPAC ambiguity codes as N. Any other character rejects the record.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD, BOS, EOS, UNK = range(4)


@dataclass(frozen=True)
class Tokenizer:
    name: str
    alphabet: str
    aliases: tuple[tuple[str, str], ...] = ()  # (letters, letter they read as)
    strip_suffix: str = ""

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + len(self.alphabet)

    def _table(self) -> np.ndarray:
        table = np.full(256, -1, dtype=np.int16)
        for offset, letter in enumerate(self.alphabet):
            for case in (letter.upper(), letter.lower()):
                table[ord(case)] = len(SPECIALS) + offset
        for letters, target in self.aliases:
            for letter in letters:
                table[ord(letter.upper())] = table[ord(letter.lower())] = table[ord(target)]
        return table

    def encode(self, sequence: str) -> np.ndarray:
        """uint8 ids of <bos> sequence <eos>; ValueError naming the first bad character."""
        sequence = sequence.rstrip(self.strip_suffix) if self.strip_suffix else sequence
        raw = np.frombuffer(sequence.encode("latin-1", errors="replace"), dtype=np.uint8)
        ids = _TABLES[self.name][raw]
        bad = np.flatnonzero(ids < 0)
        if bad.size:
            position = int(bad[0])
            raise ValueError(f"character {sequence[position]!r} at position {position + 1} is not {self.name}")
        return np.concatenate([[BOS], ids.astype(np.uint8), [EOS]]).astype(np.uint8)

    def decode(self, ids: np.ndarray) -> str:
        vocabulary = list(SPECIALS) + list(self.alphabet)
        return "".join(vocabulary[int(i)] if int(i) >= len(SPECIALS) else "" for i in ids)


TOKENIZERS = {
    "protein": Tokenizer("protein", "ACDEFGHIKLMNPQRSTVWYXBZUO", strip_suffix="*"),
    "nucleotide": Tokenizer("nucleotide", "ACGTN", aliases=(("U", "T"), ("RYKMSWBDHV", "N"))),
}
_TABLES = {name: tokenizer._table() for name, tokenizer in TOKENIZERS.items()}
