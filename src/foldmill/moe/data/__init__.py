"""Training data: FASTA corpora tokenized, packed into shards of token ids, split train/val by record."""
