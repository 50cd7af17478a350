"""Pairing keys from MSA row headers.

Rows of different chains' MSAs that share a key are paired (placed in the same MSA row) for
complexes. The key says "these sequences come from the same organism" where the header carries
it, so paired rows tend to be interacting orthologs:

  TaxID=9606 (UniRef50/90 headers), OX=9606 (UniProt headers)   -> "taxid:9606"
  a UniProt entry name ACCESSION_SPECIES / NAME_SPECIES          -> "species:HUMAN"
  a bare UniRef100 id (ColabFold A3Ms carry nothing else)        -> "uniref:UniRef100_P12345"
  anything else                                                   -> "" (unpaired)

The UniRef id fallback is what OSS Boltz uses without a taxonomy database; it pairs only hits of
the same cluster, which matters for homo-oligomers.
"""

from __future__ import annotations

import re

_TAXID = re.compile(r"\b(?:TaxID|OX)=(\d+)")
# UniProt entry names: "RepID=A0A4U1FNC5_MONMO", "sp|P69905|HBA_HUMAN", "tr|Q8XXX1|Q8XXX1_ECOLI"
_ENTRY_NAME = re.compile(r"(?:RepID=|\|)[A-Z0-9]{1,10}_([A-Z0-9]{2,5})\b")
_UNIREF = re.compile(r"^(UniRef(?:100|90|50)_[A-Za-z0-9-]+)")


def pairing_key(header: str) -> str:
    """The pairing key of a row whose FASTA header (without '>') is `header`; "" = unpaired."""
    match = _TAXID.search(header)
    if match:
        return f"taxid:{match.group(1)}"
    match = _ENTRY_NAME.search(header)
    if match:
        return f"species:{match.group(1)}"
    match = _UNIREF.match(header.strip())
    if match:
        return f"uniref:{match.group(1)}"
    return ""
