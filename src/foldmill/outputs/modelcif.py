"""mmCIF text of one ranked model, ModelCIF-style (the categories python-modelcif writes for ModelCIF 1.4).

gemmi writes the coordinates (`_atom_site`, B-factor = pLDDT x 100), `_struct_asym` and
`_entity_poly_seq`; this module adds the entity, chemical component and ModelCIF categories:
software and its parameters (foldmill version, model checkpoint or "demo", seed, recipe), the
modelling protocol, the model list (name says rank and whether it is the best), and QA metrics:
global pLDDT (0-100), pTM, ipTM and Boltz's confidence score, local pLDDT per residue.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import gemmi
import numpy as np

from foldmill import __version__
from foldmill.outputs.layout import Chain
from foldmill.outputs.prediction import Prediction
from foldmill.provenance import DEMO_MODEL, DEMO_WARNING

MODELCIF_DICT = ("mmcif_ma.dic", "1.4.9", "https://raw.githubusercontent.com/ihmwg/ModelCIF/master/dist/mmcif_ma.dic")
POLY_TYPES = {"protein": "polypeptide(L)", "dna": "polydeoxyribonucleotide", "rna": "polyribonucleotide"}
LINK_TYPES = {"protein": "L-peptide linking", "dna": "DNA linking", "rna": "RNA linking", "ligand": "non-polymer"}
# _chem_comp.type values as the dictionary spells them (the CCD in biotite has them upper-case).
CHEM_COMP_TYPES = {
    value.lower(): value
    for value in (
        *LINK_TYPES.values(),
        "peptide linking", "D-peptide linking", "L-peptide NH3 amino terminus", "L-peptide COOH carboxy terminus",
        "peptide-like", "L-RNA linking", "DNA OH 3 prime terminus", "RNA OH 3 prime terminus",
        "D-saccharide", "L-saccharide", "saccharide", "other",
    )
}  # fmt: skip
# _ma_qa_metric rows: id, name, type, mode, description.
QA_METRICS = (
    (1, "pLDDT", "pLDDT", "global", "complex pLDDT (Boltz complex_plddt x 100)"),
    (2, "pTM", "pTM", "global", "predicted TM-score"),
    (3, "ipTM", "ipTM", "global", "interface predicted TM-score (0 for a single chain)"),
    (4, "confidence_score", "other", "global", "Boltz ranking score (4 x complex_plddt + (ipTM if > 0 else pTM)) / 5"),
    (5, "pLDDT", "pLDDT", "local", "per-residue pLDDT (mean over the residue's tokens) x 100"),
)
LOCAL_PLDDT_ID = 5


@dataclass(frozen=True)
class RankedModel:
    """Which sample a file holds and where it stands among the written ones."""

    sample: int
    rank: int  # 0 = best by confidence_score
    n_ranked: int


def model_label(provenance: dict[str, Any]) -> str:
    """The model used, for humans: the checkpoint hash, or the demo warning."""
    model = str(provenance.get("model", "unknown"))
    return DEMO_WARNING if model == DEMO_MODEL else f"checkpoint sha256 {model}"


def add_modelcif_categories(
    block: gemmi.cif.Block, prediction: Prediction, chains: list[Chain], ranked: RankedModel
) -> None:
    """Header categories (software to model list); call before gemmi adds the coordinates."""
    title = f"foldmill prediction of {prediction.target_id}, model {ranked.rank}"
    if prediction.provenance.get("model") == DEMO_MODEL:
        title += f" ({DEMO_WARNING})"
    block.set_pair("_entry.id", gemmi.cif.quote(prediction.target_id))
    block.set_mmcif_category(
        "_struct.",
        {
            "entry_id": [prediction.target_id],
            "title": [title],
            "pdbx_structure_determination_methodology": ["computational"],
        },
    )
    name, version, location = MODELCIF_DICT
    block.set_mmcif_category(
        "_audit_conform.", {"dict_name": [name], "dict_version": [version], "dict_location": [location]}
    )
    block.set_mmcif_category(
        "_software.",
        {
            "pdbx_ordinal": ["1"],
            "name": ["foldmill"],
            "classification": ["model building"],
            "description": ["Boltz-2-compatible structure prediction"],
            "version": [str(prediction.provenance.get("foldmill_version", __version__))],
            "type": ["package"],
        },
    )
    block.set_mmcif_category(
        "_ma_software_group.",
        {"ordinal_id": ["1"], "group_id": ["1"], "software_id": ["1"], "parameter_group_id": ["1"]},
    )
    _add_parameters(block, prediction.provenance)
    _add_chem_comps(block, chains)
    _add_entities(block, chains)
    _add_protocol(block, prediction, chains, ranked)


def add_qa_metrics(block: gemmi.cif.Block, prediction: Prediction, chains: list[Chain], sample: int) -> None:
    """Global and per-residue QA metrics; call after gemmi adds the coordinates."""
    block.set_mmcif_category(
        "_ma_qa_metric.",
        {
            "id": [str(row[0]) for row in QA_METRICS],
            "name": [row[1] for row in QA_METRICS],
            "description": [row[4] for row in QA_METRICS],
            "type": [row[2] for row in QA_METRICS],
            "mode": [row[3] for row in QA_METRICS],
            "type_other_details": [row[4] if row[2] == "other" else False for row in QA_METRICS],
            "software_group_id": ["1"] * len(QA_METRICS),
        },
    )
    global_values = [  # metric ids 1-4 of QA_METRICS, in order
        100 * float(prediction.complex_plddt[sample]),
        float(prediction.ptm[sample]),
        float(prediction.iptm[sample]),
        float(prediction.confidence_score[sample]),
    ]
    block.set_mmcif_category(
        "_ma_qa_metric_global.",
        {
            "ordinal_id": [str(i + 1) for i in range(len(global_values))],
            "model_id": ["1"] * len(global_values),
            "metric_id": [str(i + 1) for i in range(len(global_values))],
            "metric_value": [f"{value:.4f}" for value in global_values],
        },
    )
    plddt = np.asarray(prediction.plddt[sample], dtype=np.float64)
    rows = [(chain, residue) for chain in chains for residue in chain.residues]
    block.set_mmcif_category(
        "_ma_qa_metric_local.",
        {
            "ordinal_id": [str(i + 1) for i in range(len(rows))],
            "model_id": ["1"] * len(rows),
            "label_asym_id": [chain.chain_id for chain, _ in rows],
            # Non-polymer residues have no label_seq_id in mmCIF.
            "label_seq_id": [str(residue.number) if chain.is_polymer else False for chain, residue in rows],
            "label_comp_id": [residue.name for _, residue in rows],
            "metric_id": [str(LOCAL_PLDDT_ID)] * len(rows),
            "metric_value": [f"{100 * plddt[residue.tokens].mean():.2f}" for _, residue in rows],
        },
    )


def _add_parameters(block: gemmi.cif.Block, provenance: dict[str, Any]) -> None:
    """Provenance as _ma_software_parameter rows; nested dicts (the recipe) become dotted names."""
    flat = {"model": str(provenance.get("model", "unknown"))}
    for key, value in provenance.items():
        if key in ("model", "foldmill_version"):
            continue
        if isinstance(value, dict):
            flat.update({f"{key}.{inner}": inner_value for inner, inner_value in value.items()})
        else:
            flat[key] = value
    names = list(flat)
    block.set_mmcif_category(
        "_ma_software_parameter.",
        {
            "parameter_id": [str(i + 1) for i in range(len(names))],
            "group_id": ["1"] * len(names),
            "data_type": [_data_type(flat[name]) for name in names],
            "name": names,
            "value": [_parameter_value(flat[name]) for name in names],
            "description": [model_label(provenance) if name == "model" else False for name in names],
        },
    )


def _data_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, np.integer)):
        return "integer"
    if isinstance(value, (float, np.floating)):
        return "float"
    return "string"


def _parameter_value(value: Any) -> str:
    if isinstance(value, bool):
        return "YES" if value else "NO"
    return str(value)


def _add_chem_comps(block: gemmi.cif.Block, chains: list[Chain]) -> None:
    comps: dict[str, tuple[str, str | bool]] = {}
    for chain in chains:
        from_smiles = chain.entity_type == "ligand" and chain.sequence != chain.residues[0].name
        for residue in chain.residues:
            if residue.name in comps:
                continue
            if from_smiles:
                comps[residue.name] = (LINK_TYPES["ligand"], "ligand given as SMILES")
            else:
                link_type, full_name = _ccd_description(residue.name)
                link_type = CHEM_COMP_TYPES.get((link_type or "").lower(), LINK_TYPES[chain.entity_type])
                comps[residue.name] = (link_type, full_name or False)
    block.set_mmcif_category(
        "_chem_comp.",
        {
            "id": list(comps),
            "type": [value[0] for value in comps.values()],
            "name": [value[1] for value in comps.values()],
        },
    )


# The standard polymer residues' CCD entries (link type, full name), as biotite's CCD has them
# (tests check). Reading biotite's whole CCD for them took ~5 s at each writer's first target.
STANDARD_COMPONENTS: dict[str, tuple[str, str]] = {
    **{
        code: ("L-PEPTIDE LINKING", name)
        for code, name in (
            ("ALA", "ALANINE"), ("ARG", "ARGININE"), ("ASN", "ASPARAGINE"), ("ASP", "ASPARTIC ACID"),
            ("CYS", "CYSTEINE"), ("GLN", "GLUTAMINE"), ("GLU", "GLUTAMIC ACID"), ("HIS", "HISTIDINE"),
            ("ILE", "ISOLEUCINE"), ("LEU", "LEUCINE"), ("LYS", "LYSINE"), ("MET", "METHIONINE"),
            ("PHE", "PHENYLALANINE"), ("PRO", "PROLINE"), ("SER", "SERINE"), ("THR", "THREONINE"),
            ("TRP", "TRYPTOPHAN"), ("TYR", "TYROSINE"), ("VAL", "VALINE"), ("UNK", "UNKNOWN"),
        )
    },  # fmt: skip
    "GLY": ("PEPTIDE LINKING", "GLYCINE"),
    "A": ("RNA LINKING", "ADENOSINE-5'-MONOPHOSPHATE"),
    "G": ("RNA LINKING", "GUANOSINE-5'-MONOPHOSPHATE"),
    "C": ("RNA LINKING", "CYTIDINE-5'-MONOPHOSPHATE"),
    "U": ("RNA LINKING", "URIDINE-5'-MONOPHOSPHATE"),
    "N": ("RNA LINKING", "ANY 5'-MONOPHOSPHATE NUCLEOTIDE"),
    "DA": ("DNA LINKING", "2'-DEOXYADENOSINE-5'-MONOPHOSPHATE"),
    "DG": ("DNA LINKING", "2'-DEOXYGUANOSINE-5'-MONOPHOSPHATE"),
    "DC": ("DNA LINKING", "2'-DEOXYCYTIDINE-5'-MONOPHOSPHATE"),
    "DT": ("DNA LINKING", "THYMIDINE-5'-MONOPHOSPHATE"),
    "DN": ("DNA LINKING", "UNKNOWN 2'-DEOXYNUCLEOTIDE"),
}


@lru_cache(maxsize=None)
def _ccd_description(code: str) -> tuple[str | None, str | None]:
    """(link type, full name) from the CCD that ships with biotite; (None, None) if unknown."""
    if code in STANDARD_COMPONENTS:
        return STANDARD_COMPONENTS[code]
    from biotite.structure import info

    try:
        return info.link_type(code), info.full_name(code)
    except KeyError:
        return None, None


def _entity_chains(chains: list[Chain]) -> dict[str, list[Chain]]:
    grouped: dict[str, list[Chain]] = {}
    for chain in chains:
        grouped.setdefault(chain.entity_id, []).append(chain)
    return grouped


def _entity_description(chain: Chain) -> str:
    if chain.is_polymer:
        return f"{chain.entity_type} chain"
    if chain.sequence == chain.residues[0].name:
        return _ccd_description(chain.sequence)[1] or f"ligand {chain.sequence}"
    return f"ligand from SMILES {chain.sequence}"


def _add_entities(block: gemmi.cif.Block, chains: list[Chain]) -> None:
    grouped = _entity_chains(chains)
    firsts = [members[0] for members in grouped.values()]
    block.set_mmcif_category(
        "_entity.",
        {
            "id": list(grouped),
            "type": ["polymer" if chain.is_polymer else "non-polymer" for chain in firsts],
            "src_method": ["man"] * len(firsts),
            "pdbx_description": [_entity_description(chain) for chain in firsts],
            "pdbx_number_of_molecules": [str(len(members)) for members in grouped.values()],
        },
    )
    polymers = [(entity_id, members) for entity_id, members in grouped.items() if members[0].is_polymer]
    if polymers:
        block.set_mmcif_category(
            "_entity_poly.",
            {
                "entity_id": [entity_id for entity_id, _ in polymers],
                "type": [POLY_TYPES[members[0].entity_type] for _, members in polymers],
                "nstd_linkage": ["no"] * len(polymers),
                "pdbx_strand_id": [",".join(chain.chain_id for chain in members) for _, members in polymers],
                "pdbx_seq_one_letter_code": [_one_letter_code(members[0]) for _, members in polymers],
                "pdbx_seq_one_letter_code_can": [members[0].sequence for _, members in polymers],
            },
        )
    ligands = [(entity_id, members[0]) for entity_id, members in grouped.items() if not members[0].is_polymer]
    if ligands:
        block.set_mmcif_category(
            "_pdbx_entity_nonpoly.",
            {
                "entity_id": [entity_id for entity_id, _ in ligands],
                "name": [_entity_description(chain) for _, chain in ligands],
                "comp_id": [chain.residues[0].name for _, chain in ligands],
            },
        )


def _one_letter_code(chain: Chain) -> str:
    """One letter per standard residue, (CCD) for modified ones, as in PDB entries."""
    kind = {"protein": gemmi.ResidueKind.AA, "dna": gemmi.ResidueKind.DNA, "rna": gemmi.ResidueKind.RNA}
    return gemmi.pdbx_one_letter_code([residue.name for residue in chain.residues], kind[chain.entity_type])


def _add_protocol(block: gemmi.cif.Block, prediction: Prediction, chains: list[Chain], ranked: RankedModel) -> None:
    grouped = _entity_chains(chains)
    n_entities = len(grouped)
    model_data_id = str(n_entities + 1)
    block.set_mmcif_category(
        "_ma_data.",
        {
            "id": [str(i + 1) for i in range(n_entities + 1)],
            "name": [_entity_description(members[0]) for members in grouped.values()] + [f"model {ranked.rank}"],
            "content_type": ["target"] * n_entities + ["model coordinates"],
        },
    )
    block.set_mmcif_category(
        "_ma_data_group.",
        {
            "ordinal_id": [str(i + 1) for i in range(n_entities + 1)],
            "group_id": ["1"] * n_entities + ["2"],
            "data_id": [str(i + 1) for i in range(n_entities + 1)],
        },
    )
    block.set_mmcif_category(
        "_ma_target_entity.",
        {
            "entity_id": list(grouped),
            "data_id": [str(i + 1) for i in range(n_entities)],
            "origin": ["designed"] * n_entities,
        },
    )
    block.set_mmcif_category(
        "_ma_target_entity_instance.",
        {"asym_id": [chain.chain_id for chain in chains], "entity_id": [chain.entity_id for chain in chains]},
    )
    recipe = prediction.provenance.get("recipe", {})
    details = ", ".join(f"{key} {value}" for key, value in recipe.items()) if isinstance(recipe, dict) else str(recipe)
    block.set_mmcif_category(
        "_ma_protocol_step.",
        {
            "ordinal_id": ["1"],
            "protocol_id": ["1"],
            "step_id": ["1"],
            "method_type": ["modeling"],
            "step_name": ["structure prediction"],
            "details": [
                f"{model_label(prediction.provenance)}; seed {prediction.provenance.get('seed', '?')}; {details}"
            ],
            "software_group_id": ["1"],
            "input_data_group_id": ["1"],
            "output_data_group_id": ["2"],
        },
    )
    best = " (best)" if ranked.rank == 0 else ""
    sample = ranked.sample
    score = float(prediction.confidence_score[sample])
    block.set_mmcif_category(
        "_ma_model_list.",
        {
            "ordinal_id": ["1"],
            "model_name": [
                f"rank {ranked.rank}{best} of {ranked.n_ranked}: sample {sample}, confidence_score {score:.4f}"
            ],
            "data_id": [model_data_id],
            "model_type": ["Ab initio model"],
        },
    )
    block.set_mmcif_category("_ma_model_group.", {"id": ["1"], "name": ["ranked models"], "details": [False]})
    block.set_mmcif_category("_ma_model_group_link.", {"group_id": ["1"], "model_id": ["1"]})


def model_cif_text(prediction: Prediction, chains: list[Chain], ranked: RankedModel, structure: gemmi.Structure) -> str:
    """The complete mmCIF file of one ranked model (`structure` from outputs.structure.build_structure)."""
    document = gemmi.cif.Document()
    block = document.add_new_block(prediction.target_id)
    add_modelcif_categories(block, prediction, chains, ranked)
    structure.update_mmcif_block(block, _coordinate_groups())
    add_qa_metrics(block, prediction, chains, ranked.sample)
    return document.as_string(gemmi.cif.Style.Pdbx)


def _coordinate_groups() -> gemmi.MmcifOutputGroups:
    """Only what gemmi writes best: atoms, struct_asym, entity_poly_seq, atom_type."""
    groups = gemmi.MmcifOutputGroups(False)
    groups.atoms = True
    groups.group_pdb = True
    groups.auth_all = True  # auth_comp_id and auth_atom_id too, which biotite reads by default
    groups.struct_asym = True
    groups.entity_poly_seq = True
    groups.atom_type = True
    return groups
