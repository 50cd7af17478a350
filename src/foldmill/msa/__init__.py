"""MSA staging: parse, pair, deduplicate, cache and search multiple sequence alignments.

Modules: types (the MSA arrays), parse (A3M / Boltz CSV / Stockholm), keys (pairing keys from
headers), features (letters to vocabulary classes), mmseqs (batched
MMseqs2 search), staging (the stage_msas rule's logic).
"""

from foldmill.msa.types import MSA

__all__ = ["MSA"]
