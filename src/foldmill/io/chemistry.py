"""Chemistry look-ups the worklist needs: CCD components and SMILES heavy-atom counts.

The Chemical Component Dictionary comes from biotite's wheel, so no download is ever needed.
"""

from __future__ import annotations

import re
from functools import lru_cache

_SMILES_BRACKET = re.compile(r"\[([^\]]+)\]")
# Organic-subset atoms outside brackets (two-letter halogens first so 'Cl' is not read as 'C').
_SMILES_ORGANIC = re.compile(r"Cl|Br|[BCNOPSFI]|[bcnops]")
_BRACKET_ELEMENT = re.compile(r"^\d*([A-Z][a-z]?|[a-z]{1,2})")


@lru_cache(maxsize=4096)
def ccd_heavy_atom_count(code: str) -> int | None:
    """Heavy atoms of a CCD component, or None if the code is not in the CCD."""
    from biotite.structure import info

    try:
        atoms = info.residue(code.upper())
    except KeyError:
        return None
    return int((atoms.element != "H").sum())


def smiles_heavy_atom_count(smiles: str) -> int:
    """Count heavy atoms in a SMILES string without RDKit.

    Bracket atoms count once unless they are hydrogen ([H], [2H]); organic-subset atoms count
    once each. Raises ValueError for a string with no atoms or unbalanced brackets.
    """
    if smiles.count("[") != smiles.count("]"):
        raise ValueError("unbalanced brackets")
    count = 0
    for inner in _SMILES_BRACKET.findall(smiles):
        match = _BRACKET_ELEMENT.match(inner)
        if not match:
            raise ValueError(f"unreadable bracket atom [{inner}]")
        if match.group(1) != "H":
            count += 1
    outside = _SMILES_BRACKET.sub("", smiles)
    if re.search(r"[^A-Za-z0-9@+\-=#$:/\\().%*]", outside):
        raise ValueError("unexpected character")
    count += len(_SMILES_ORGANIC.findall(outside))
    if count == 0:
        raise ValueError("no heavy atoms")
    return count
