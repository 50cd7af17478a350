"""MSA staging: parse, pair, deduplicate, cache and search multiple sequence alignments."""

from foldmill.msa.types import MSA

__all__ = ["MSA"]
