"""Per-target outputs: validation, mmCIF/PDB/JSON/npz writing, read back by gemmi, Biopython, biotite."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gemmi
import numpy as np
import pytest

from foldmill.errors import FoldmillError
from foldmill.outputs.confidence import interface_pae, representative_atoms
from foldmill.outputs.modelcif import STANDARD_COMPONENTS
from foldmill.outputs.prediction import CONFIDENCE_SCALARS
from foldmill.outputs.layout import chain_layout
from foldmill.outputs.synthetic import synthetic_prediction
from foldmill.outputs.validation import InvalidPrediction
from foldmill.outputs.writer import DONE_MARKER, model_files, record_name, target_dir, write_prediction

# Two copies of one protein (one entity), DNA, RNA and a CCD ligand: every chain type.
CHAINS = [
    ("A", "protein", "MKTAYIAKQRG"),
    ("B", "dna", "ACGT"),
    ("C", "protein", "MKTAYIAKQRG"),
    ("R", "rna", "GCAU"),
    ("L", "ligand", "SAH"),
]
ONE_LETTER = {"protein": gemmi.ResidueKind.AA, "dna": gemmi.ResidueKind.DNA, "rna": gemmi.ResidueKind.RNA}
PROVENANCE = {"model": "demo", "seed": 7, "recipe": {"recycles": 3, "steps": 200, "samples": 3}}


@pytest.fixture(scope="module")
def prediction():
    return synthetic_prediction("cx1", CHAINS, n_samples=3, seed=3, provenance=PROVENANCE)


@pytest.fixture(scope="module")
def written(prediction, tmp_path_factory):
    outdir = tmp_path_factory.mktemp("out")
    return write_prediction(prediction, outdir, write_pdb=True)


def ranked(prediction) -> list[int]:
    return list(np.argsort(-prediction.confidence_score))


def test_directory_layout_and_ranking(prediction, written):
    assert written.name == "cx1" and written.parent.name == "predictions"
    assert (written / DONE_MARKER).exists()
    record = json.loads((written / record_name("cx1")).read_text())
    order = ranked(prediction)
    assert [m["sample"] for m in record["models"]] == order
    assert [m["rank"] for m in record["models"]] == [0, 1, 2]
    assert [m["best"] for m in record["models"]] == [True, False, False]
    scores = [m["confidence_score"] for m in record["models"]]
    assert scores == sorted(scores, reverse=True)
    expected = {record_name("cx1"), DONE_MARKER}
    for rank in range(3):
        expected |= set(model_files("cx1", rank).values())
    assert {p.name for p in written.iterdir()} == expected
    assert not [p for p in written.parent.iterdir() if p.name.startswith(".")]  # no staging leftovers
    assert record["provenance"] == PROVENANCE
    assert record["n_tokens"] == len(prediction.token_chain_ids) and record["n_atoms"] == prediction.coords.shape[1]
    chains = {c["chain_id"]: c for c in record["chains"]}
    assert [c["chain_id"] for c in record["chains"]] == ["A", "B", "C", "R", "L"]
    assert chains["A"]["entity_id"] == chains["C"]["entity_id"] != chains["B"]["entity_id"]
    assert chains["L"]["residues"] == 1 and chains["L"]["tokens"] == 26  # SAH: 26 heavy atoms, one token each
    assert chains["B"]["residues"] == 4 and chains["B"]["sequence"] == "ACGT"


def test_confidence_json_has_boltz_fields_and_values(prediction, written):
    n_chains = len(CHAINS)
    for rank, sample in enumerate(ranked(prediction)):
        data = json.loads((written / f"confidence_cx1_model_{rank}.json").read_text())
        assert list(data) == [*CONFIDENCE_SCALARS, "chains_ptm", "pair_chains_iptm"]
        assert data["confidence_score"] == pytest.approx(float(prediction.confidence_score[sample]), abs=0)
        for key in CONFIDENCE_SCALARS[1:]:
            assert data[key] == float(getattr(prediction, key)[sample]), key
        assert data["chains_ptm"] == {str(i): float(prediction.chains_ptm[sample, i]) for i in range(n_chains)}
        assert list(data["pair_chains_iptm"]) == [str(i) for i in range(n_chains)]
        for i in range(n_chains):
            for j in range(n_chains):
                assert data["pair_chains_iptm"][str(i)][str(j)] == float(prediction.pair_chains_iptm[sample, i, j])


def test_npz_arrays_round_trip(prediction, written):
    for rank, sample in enumerate(ranked(prediction)):
        for key in ("plddt", "pae", "pde"):
            with np.load(written / f"{key}_cx1_model_{rank}.npz", allow_pickle=False) as data:
                assert list(data.keys()) == [key]
                np.testing.assert_array_equal(data[key], getattr(prediction, key)[sample])


def _expected_chains(prediction, sample):
    """chain id -> (residue names, coordinates (n, 3), B-factors) straight from the Prediction."""
    atoms = prediction.atoms
    out = {}
    for chain_id, _, _ in CHAINS:
        mask = atoms.chain_ids == chain_id
        names = list(dict.fromkeys(zip(atoms.residue_numbers[mask], atoms.residue_names[mask])))
        bfactors = np.round(prediction.plddt[sample][atoms.token_index[mask]] * 100, 2)
        out[chain_id] = ([n for _, n in names], prediction.coords[sample][mask], bfactors)
    return out


def test_mmcif_round_trips_through_gemmi(prediction, written):
    for rank, sample in enumerate(ranked(prediction)):
        structure = gemmi.read_structure(str(written / f"cx1_model_{rank}.cif"))
        expected = _expected_chains(prediction, sample)
        assert [chain.name for chain in structure[0]] == [c for c, _, _ in CHAINS]
        for (chain_id, entity_type, sequence), chain in zip(CHAINS, structure[0]):
            names, coords, bfactors = expected[chain_id]
            assert [r.name for r in chain] == names
            if entity_type != "ligand":
                assert gemmi.pdbx_one_letter_code([r.name for r in chain], ONE_LETTER[entity_type]) == sequence
            got = np.array([a.pos.tolist() for r in chain for a in r])
            np.testing.assert_allclose(got, coords, atol=5.1e-4)
            np.testing.assert_allclose([a.b_iso for r in chain for a in r], bfactors, atol=1e-6)
            assert all(r.het_flag == ("H" if entity_type == "ligand" else "A") for r in chain)
        structure.setup_entities()
        entities = {tuple(e.subchains): e for e in structure.entities}
        assert entities[("A", "C")].polymer_type == gemmi.PolymerType.PeptideL
        assert entities[("B",)].polymer_type == gemmi.PolymerType.Dna
        assert entities[("R",)].polymer_type == gemmi.PolymerType.Rna
        assert entities[("L",)].entity_type == gemmi.EntityType.NonPolymer


def test_mmcif_round_trips_through_biopython(prediction, written):
    from Bio.PDB import MMCIFParser
    from Bio.SeqUtils import seq1

    sample = ranked(prediction)[0]
    model = MMCIFParser(QUIET=True).get_structure("cx1", str(written / "cx1_model_0.cif"))[0]
    expected = _expected_chains(prediction, sample)
    assert [chain.id for chain in model] == [c for c, _, _ in CHAINS]
    for chain_id, entity_type, sequence in CHAINS:
        residues = list(model[chain_id])
        names, coords, bfactors = expected[chain_id]
        assert [r.get_resname() for r in residues] == names
        if entity_type == "protein":
            assert seq1("".join(r.get_resname() for r in residues)) == sequence
        if entity_type == "ligand":
            assert residues[0].id[0] == "H_SAH"
        atoms = [a for r in residues for a in r]
        np.testing.assert_allclose([a.coord for a in atoms], coords, atol=5.1e-4)
        np.testing.assert_allclose([a.bfactor for a in atoms], bfactors, atol=1e-6)


def test_mmcif_round_trips_through_biotite(prediction, written):
    import biotite.structure.io.pdbx as pdbx

    sample = ranked(prediction)[0]
    cif = pdbx.CIFFile.read(str(written / "cx1_model_0.cif"))
    array = pdbx.get_structure(cif, model=1, extra_fields=["b_factor"])
    np.testing.assert_allclose(array.coord, prediction.coords[sample], atol=5.1e-4)
    np.testing.assert_array_equal(array.chain_id, prediction.atoms.chain_ids)
    np.testing.assert_array_equal(array.res_id, prediction.atoms.residue_numbers)
    np.testing.assert_array_equal(array.atom_name, prediction.atoms.atom_names)
    np.testing.assert_array_equal(array.hetero, prediction.atoms.entity_types == "ligand")
    np.testing.assert_allclose(
        array.b_factor, np.round(prediction.plddt[sample][prediction.atoms.token_index] * 100, 2)
    )
    sequences = {key: str(value) for key, value in pdbx.get_sequence(cif).items()}
    # Read from _entity_poly; biotite's nucleotide alphabet spells U as T.
    assert sequences == {"A": "MKTAYIAKQRG", "C": "MKTAYIAKQRG", "B": "ACGT", "R": "GCAT"}


def _block(path: Path) -> gemmi.cif.Block:
    return gemmi.cif.read(str(path)).sole_block()


def test_modelcif_qa_metrics_and_provenance(prediction, written):
    for rank, sample in enumerate(ranked(prediction)):
        block = _block(written / f"cx1_model_{rank}.cif")
        metrics = block.get_mmcif_category("_ma_qa_metric.")
        by_id = {i: (n, t, m) for i, n, t, m in zip(metrics["id"], metrics["name"], metrics["type"], metrics["mode"])}
        global_rows = block.get_mmcif_category("_ma_qa_metric_global.")
        values = {by_id[i][0]: float(v) for i, v in zip(global_rows["metric_id"], global_rows["metric_value"])}
        assert values["pLDDT"] == pytest.approx(100 * prediction.complex_plddt[sample], abs=1e-4)
        assert values["pTM"] == pytest.approx(prediction.ptm[sample], abs=1e-4)
        assert values["ipTM"] == pytest.approx(prediction.iptm[sample], abs=1e-4)
        assert values["confidence_score"] == pytest.approx(prediction.confidence_score[sample], abs=1e-4)
        local = block.get_mmcif_category("_ma_qa_metric_local.")
        assert {by_id[i] for i in local["metric_id"]} == {("pLDDT", "pLDDT", "local")}
        chains = chain_layout(prediction)
        residues = [(c, r) for c in chains for r in c.residues]
        assert len(local["metric_value"]) == len(residues)
        for (chain, residue), asym, seq, value in zip(
            residues, local["label_asym_id"], local["label_seq_id"], local["metric_value"]
        ):
            assert asym == chain.chain_id
            assert seq == (str(residue.number) if chain.is_polymer else False)  # '.' for the ligand
            assert float(value) == pytest.approx(100 * prediction.plddt[sample][residue.tokens].mean(), abs=0.006)
        model_name = block.find_value("_ma_model_list.model_name")
        assert ("(best)" in model_name) == (rank == 0) and f"sample {sample}" in model_name
        parameters = block.get_mmcif_category("_ma_software_parameter.")
        params = dict(zip(parameters["name"], parameters["value"]))
        assert params == {
            "model": "demo",
            "seed": "7",
            "recipe.recycles": "3",
            "recipe.steps": "200",
            "recipe.samples": "3",
        }
        assert "NOT a trained model" in parameters["description"][0]
        assert "NOT a trained model" in block.find_value("_struct.title")
        assert block.find_value("_software.name") == "foldmill"
        poly = block.get_mmcif_category("_entity_poly.")
        assert poly["pdbx_seq_one_letter_code_can"] == ["MKTAYIAKQRG", "ACGT", "GCAU"]
        assert poly["pdbx_strand_id"] == ["A,C", "B", "R"]


def test_modelcif_reader_accepts_the_file(prediction, written):
    reader = pytest.importorskip("modelcif.reader")
    with open(written / "cx1_model_0.cif") as handle:
        (system,) = reader.read(handle)
    (model,) = [m for group in system.model_groups for m in group]
    global_values = [q.value for q in model.qa_metrics][:4]
    sample = ranked(prediction)[0]
    assert global_values[1] == pytest.approx(prediction.ptm[sample], abs=1e-4)
    assert [sw.name for sw in system.software] == ["foldmill"]


def test_pdb_is_readable_with_plddt_bfactors(prediction, written):
    sample = ranked(prediction)[1]
    structure = gemmi.read_structure(str(written / "cx1_model_1.pdb"))
    atoms = [a for chain in structure[0] for r in chain for a in r]
    np.testing.assert_allclose([a.pos.tolist() for a in atoms], prediction.coords[sample], atol=5.1e-4)
    np.testing.assert_allclose(
        [a.b_iso for a in atoms], np.round(prediction.plddt[sample][prediction.atoms.token_index] * 100, 2)
    )


def test_top_k_and_rewrite_replace_the_directory(prediction, tmp_path):
    write_prediction(prediction, tmp_path, write_pdb=True)
    written = write_prediction(prediction, tmp_path, top_k=1)
    assert sorted(p.name for p in written.iterdir()) == sorted(
        [*[n for k, n in model_files("cx1", 0).items() if k != "pdb"], record_name("cx1"), DONE_MARKER]
    )
    record = json.loads((written / record_name("cx1")).read_text())
    assert [m["sample"] for m in record["models"]] == ranked(prediction)[:1]
    assert [p.name for p in (tmp_path / "predictions").iterdir()] == ["cx1"]


def _broken(prediction, **changes):
    return dataclasses.replace(prediction, **changes)


def _bad_cases(p):
    nan_coords = p.coords.copy()
    nan_coords[1, 5, 2] = np.nan
    inf_coords = p.coords.copy()
    inf_coords[0, 0, 0] = np.inf
    high_plddt = p.plddt.copy()
    high_plddt[0, 0] = 1.5
    wrong_chain = dataclasses.replace(p.atoms, chain_ids=np.where(p.atoms.chain_ids == "B", "A", p.atoms.chain_ids))
    return {
        "nan coordinates": (_broken(p, coords=nan_coords), "non-finite coordinates (NaN/inf) in sample(s) [1]"),
        "inf coordinates": (_broken(p, coords=inf_coords), "non-finite coordinates (NaN/inf) in sample(s) [0]"),
        "missing ptm": (_broken(p, ptm=None), "missing confidence ptm"),
        "missing pae": (_broken(p, pae=None), "missing confidence pae"),
        "plddt shape": (_broken(p, plddt=p.plddt[:, :-1]), "plddt has shape"),
        "pae shape": (_broken(p, pae=p.pae[:, :3]), "pae has shape"),
        "nan iptm": (_broken(p, iptm=np.array([0.5, np.nan, 0.5])), "iptm has non-finite values"),
        "plddt range": (_broken(p, plddt=high_plddt), "plddt outside [0, 1]"),
        "chains_ptm shape": (_broken(p, chains_ptm=p.chains_ptm[:, :2]), "chains_ptm has shape"),
        "chain mismatch": (_broken(p, atoms=wrong_chain), "disagree with token_chain_ids"),
        "no samples": (_broken(p, coords=p.coords[:0]), "no samples or no atoms"),
        "unsafe id": (_broken(p, target_id="../evil"), "not a safe file name"),
        "missing sequence": (
            _broken(p, sequences={k: v for k, v in p.sequences.items() if k != "R"}),
            "no sequence for chain R",
        ),
    }


BAD_CASES = [
    "nan coordinates", "inf coordinates", "missing ptm", "missing pae", "plddt shape", "pae shape", "nan iptm",
    "plddt range", "chains_ptm shape", "chain mismatch", "no samples", "unsafe id", "missing sequence",
]  # fmt: skip


def test_every_bad_case_is_exercised(prediction):
    assert sorted(_bad_cases(prediction)) == sorted(BAD_CASES)


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_predictions_are_rejected_with_a_reason_and_not_written(prediction, tmp_path, case):
    bad, reason = _bad_cases(prediction)[case]
    with pytest.raises(InvalidPrediction) as error:
        write_prediction(bad, tmp_path)
    assert reason in error.value.reason
    assert str(error.value).startswith(f"{bad.target_id}: prediction rejected: ")
    assert not (tmp_path / "predictions").exists() or not any((tmp_path / "predictions").iterdir())


def test_target_dir_stays_inside_outdir(tmp_path):
    assert target_dir(tmp_path, "ok_1") == (tmp_path / "predictions" / "ok_1").resolve()
    for bad in ("../escape", "a/../../b", "/etc"):
        with pytest.raises(FoldmillError):
            target_dir(tmp_path, bad)


def test_interface_pae_on_known_geometry():
    """Two glycine dimers: only A1-B1 are within 8 A, so the interface PAE is the mean of their two PAEs."""
    p = synthetic_prediction("ifc", [("A", "protein", "GG"), ("B", "protein", "GG")], n_samples=1)
    centres = {("A", 1): (0, 0, 0), ("A", 2): (100, 0, 0), ("B", 1): (5, 0, 0), ("B", 2): (200, 0, 0)}
    coords = np.array(
        [[centres[(c, int(n))] for c, n in zip(p.atoms.chain_ids, p.atoms.residue_numbers)]], dtype=np.float32
    )
    pae = np.full((1, 4, 4), 30.0)
    pae[0, 0, 2], pae[0, 2, 0] = 4.0, 6.0  # tokens: A1=0, A2=1, B1=2, B2=3
    p = dataclasses.replace(p, coords=coords, pae=pae)
    assert interface_pae(p, chain_layout(p), 0) == (5.0, 2)
    monomer = synthetic_prediction("m", [("A", "protein", "GG")], n_samples=1)
    assert interface_pae(monomer, chain_layout(monomer), 0) == (None, 0)


def test_interface_pae_is_the_mean_over_every_inter_chain_contact(prediction):
    """On the five-chain complex: the pairwise definition, computed directly over all token pairs."""
    chains = chain_layout(prediction)
    for sample in range(prediction.n_samples):
        points = prediction.coords[sample][representative_atoms(prediction, chains)].astype(np.float64)
        chain_of = np.asarray(prediction.token_chain_ids).astype(str)
        distance = np.linalg.norm(points[:, None] - points[None, :], axis=-1)
        contact = (distance < 8.0) & (chain_of[:, None] != chain_of[None, :])
        expected = float(prediction.pae[sample][contact].mean()) if contact.any() else None
        value, count = interface_pae(prediction, chains, sample)
        assert count == int(contact.sum()) and count > 0
        assert value == pytest.approx(expected, rel=1e-12)


def test_standard_components_match_biotites_ccd():
    from biotite.structure import info

    for code, (link_type, name) in STANDARD_COMPONENTS.items():
        assert (info.link_type(code), info.full_name(code)) == (link_type, name), code


def test_modified_residue_and_smiles_ligand(tmp_path):
    """A selenomethionine tokenized per atom (as Boltz does) and a SMILES ligand named LIG."""
    p = synthetic_prediction("mod", [("A", "protein", "GMG"), ("L", "ligand", "SAH")], n_samples=1, seed=1)
    atoms = p.atoms
    modified = (atoms.chain_ids == "A") & (atoms.residue_numbers == 2)
    names = np.where(modified, "MSE", atoms.residue_names)
    atom_names = np.where(modified & (atoms.atom_names == "SD"), "SE", atoms.atom_names)
    elements = np.where(modified & (atoms.atom_names == "SD"), "SE", atoms.elements)
    # Re-tokenize: every atom of residue A2 becomes its own token.
    token_index, previous, tokens = [], None, []
    for i, (chain, number) in enumerate(zip(atoms.chain_ids, atoms.residue_numbers)):
        key = (chain, number) if not modified[i] and chain != "L" else ("atom", i)
        if key != previous:
            tokens.append(chain)
        token_index.append(len(tokens) - 1)
        previous = key
    n_tokens = len(tokens)
    rng = np.random.default_rng(0)
    p = dataclasses.replace(
        p,
        atoms=dataclasses.replace(atoms, residue_names=names, atom_names=atom_names, elements=elements,
                                  token_index=np.array(token_index)),
        sequences={"A": "GMG", "L": "CC(N)C(=O)O"},
        token_chain_ids=np.array(tokens),
        plddt=rng.uniform(0, 1, (1, n_tokens)),
        pae=rng.uniform(0, 30, (1, n_tokens, n_tokens)),
        pde=rng.uniform(0, 30, (1, n_tokens, n_tokens)),
        provenance={"model": "ab" * 32, "seed": np.int64(11), "recipe": {"steps": np.int32(2)}},
    )  # fmt: skip
    p.atoms.residue_names[p.atoms.chain_ids == "L"] = "LIG"
    directory = write_prediction(p, tmp_path, write_pdb=True)
    block = _block(directory / "mod_model_0.cif")
    poly = block.get_mmcif_category("_entity_poly.")
    assert (poly["pdbx_seq_one_letter_code"], poly["pdbx_seq_one_letter_code_can"]) == (["G(MSE)G"], ["GMG"])
    comps = block.get_mmcif_category("_chem_comp.")
    comp = dict(zip(comps["id"], zip(comps["type"], comps["name"])))
    assert comp["LIG"] == ("non-polymer", "ligand given as SMILES")
    assert comp["MSE"] == ("L-peptide linking", "SELENOMETHIONINE")
    assert "from SMILES CC(N)C(=O)O" in block.find_value("_pdbx_entity_nonpoly.name")
    local = block.get_mmcif_category("_ma_qa_metric_local.")
    mse_tokens = np.unique(np.array(token_index)[modified])
    assert len(mse_tokens) == int(modified.sum()) > 1
    assert float(local["metric_value"][1]) == pytest.approx(100 * p.plddt[0, mse_tokens].mean(), abs=0.006)
    assert gemmi.read_structure(str(directory / "mod_model_0.cif"))[0]["A"][1].name == "MSE"
    parameters = block.get_mmcif_category("_ma_software_parameter.")
    assert dict(zip(parameters["name"], parameters["data_type"])) == {
        "model": "string",
        "seed": "integer",
        "recipe.steps": "integer",
    }
    assert "checkpoint sha256 " + "ab" * 32 == parameters["description"][0]
    assert "NOT a trained model" not in block.find_value("_struct.title")
    record = json.loads((directory / record_name("mod")).read_text())
    assert record["provenance"] == {"model": "ab" * 32, "seed": 11, "recipe": {"steps": 2}}
    assert (directory / "mod_model_0.pdb").exists()


def test_pdb_is_skipped_when_chain_ids_do_not_fit(tmp_path):
    p = synthetic_prediction("long", [("AB1", "protein", "GG"), ("B", "protein", "GA")], n_samples=1)
    directory = write_prediction(p, tmp_path, write_pdb=True)
    assert not list(directory.glob("*.pdb")) and (directory / "long_model_0.cif").exists()
    record = json.loads((directory / record_name("long")).read_text())
    assert "chain ids longer than 2 characters (AB1)" in record["pdb_skipped"]
