"""OSS Boltz-2 (boltz-community) as a numerical oracle for the tests.

- build_mols_dir(codes, path): a Boltz `mols` directory (RDKit pickles) for CCD codes, built
  from the CCD that ships inside biotite, so the OSS pipeline runs offline. Each molecule
  has one conformer (biotite's component coordinates: ideal, model where ideal is missing,
  named "Ideal"), atom properties "name" and "leaving_atom", and stereo tags from 3D.
- mols_for_yaml(yaml_path): the codes such a directory needs for one Boltz YAML.
- oss_features(yaml_path, mols_dir): the feature dict OSS Boltz-2 feeds its model for that
  YAML (parse -> MSA -> tokenize -> featurize, batch of one), without running its CLI.
- oss_model(config, seed): OSS `Boltz2` built with the hyperparameters of a
  foldmill Boltz2Config, its weights replaced by foldmill's seeded `randomize_weights`
  (training initialisation zeroes many output layers, which would hide differences).
- write_case(name, directory, data_dir): small Boltz YAML inputs (with their MSA files) for
  the oracle cases, ORACLE_CASES.
Fixtures (import them into a test module to use them):
- oracle_features: session-wide; oracle_features(case) -> a fresh copy of the OSS features of
  one of ORACLE_CASES (built on first use, one shared mols directory).
- one_torch_thread: runs a module single-threaded; the oracle models are tiny, and two
  OpenMP threads on a busy 2-core machine are ~10x slower.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from foldmill.bench._oss_reference import oss_hyperparameters
from foldmill.model.config import Boltz2Config
from foldmill.model.demo import randomize_weights

# Residues every Boltz-2 input needs (boltz.data.const.canonical_tokens).
CANONICAL_CODES = (
    "ALA", "ARG", "ASN", "ASP", "CYS", "GLN", "GLU", "GLY", "HIS", "ILE",
    "LEU", "LYS", "MET", "PHE", "PRO", "SER", "THR", "TRP", "TYR", "VAL", "UNK",
)  # fmt: skip
NUCLEIC_CODES = ("A", "G", "C", "U", "N", "DA", "DG", "DC", "DT", "DN")


@pytest.fixture(scope="module")
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def oracle_features(tmp_path_factory):
    root = tmp_path_factory.mktemp("oracle_cases")
    data_dir = Path(__file__).parent / "data"
    cache: dict[str, dict[str, torch.Tensor]] = {}

    def features(case: str) -> dict[str, torch.Tensor]:
        if case not in cache:
            yaml_path = write_case(case, root / case, data_dir)
            mols_dir = build_mols_dir(mols_for_yaml(yaml_path), root / "mols")
            cache[case] = oss_features(yaml_path, mols_dir)
        return {key: value.clone() for key, value in cache[case].items()}

    return features


def _ccd_mol(code: str) -> Any:
    import biotite.structure.info as info
    from biotite.interface.rdkit import to_mol
    from rdkit import Chem

    atoms = info.residue(code, allow_missing_coord=True)
    atoms.coord = np.nan_to_num(atoms.coord)
    leaving = info.get_from_ccd("chem_comp_atom", code, "pdbx_leaving_atom_flag")
    leaving = leaving.as_array(str) if leaving is not None else np.full(len(atoms), "N")
    atoms.set_annotation("name", atoms.atom_name.astype(str))
    atoms.set_annotation("leaving_atom", np.where(leaving == "Y", "1", "0"))
    mol = to_mol(atoms, include_extra_annotations=["name", "leaving_atom"])
    try:
        Chem.SanitizeMol(mol)
    except Exception:  # noqa: BLE001 - some CCD entries (metals, odd valences) only partially sanitise
        mol.UpdatePropertyCache(strict=False)
    Chem.AssignStereochemistryFrom3D(mol)
    mol.GetConformer().SetProp("name", "Ideal")
    return mol


def build_mols_dir(codes: list[str] | tuple[str, ...], path: str | Path) -> Path:
    """Write `<path>/<CODE>.pkl` RDKit molecules for the given CCD codes (and the canonical residues)."""
    from rdkit import Chem

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    Chem.SetDefaultPickleProperties(Chem.PropertyPickleOptions.AllProps)
    for code in dict.fromkeys([*CANONICAL_CODES, *NUCLEIC_CODES, *codes]):
        target = path / f"{code}.pkl"
        if not target.exists():
            target.write_bytes(pickle.dumps(_ccd_mol(code)))
    return path


def mols_for_yaml(yaml_path: str | Path) -> list[str]:
    """CCD codes of ligands in a Boltz YAML and residue names of its template structures."""
    spec = yaml.safe_load(Path(yaml_path).read_text())
    codes = []
    for item in spec.get("sequences", []):
        ccd = item.get("ligand", {}).get("ccd")
        if ccd:
            codes.extend([ccd] if isinstance(ccd, str) else ccd)
    for template in spec.get("templates", []):
        import gemmi

        structure = gemmi.read_structure(str(Path(yaml_path).parent / (template.get("cif") or template["pdb"])))
        codes.extend({residue.name for model in structure for chain in model for residue in chain})
    return sorted(set(codes))


def oss_features(yaml_path: str | Path, mols_dir: str | Path, seed: int = 42) -> dict[str, torch.Tensor]:
    """The OSS Boltz-2 inference feature dict (batch of one) for a Boltz YAML; MSAs must be files or 'empty'."""
    from boltz.data import const
    from boltz.data.feature.featurizerv2 import Boltz2Featurizer
    from boltz.data.module.inferencev2 import collate
    from boltz.data.mol import load_canonicals, load_molecules
    from boltz.data.parse.a3m import parse_a3m
    from boltz.data.parse.csv import parse_csv
    from boltz.data.parse.yaml import parse_yaml
    from boltz.data.tokenize.boltz2 import Boltz2Tokenizer
    from boltz.data.types import Input

    mols_dir = Path(mols_dir)
    canonicals = load_canonicals(mols_dir)
    target = parse_yaml(Path(yaml_path), canonicals, mols_dir, True)

    msas = {}
    for chain in target.record.chains:
        if chain.msa_id == 0:
            raise ValueError(f"{yaml_path}: chain {chain.chain_name} has no MSA (give a file or 'empty')")
        if chain.msa_id != -1:
            msa_path = Path(chain.msa_id)
            parse = parse_a3m if msa_path.suffix == ".a3m" else parse_csv
            kwargs = {"taxonomy": None} if msa_path.suffix == ".a3m" else {}
            msas[chain.chain_id] = parse(msa_path, max_seqs=const.max_msa_seqs, **kwargs)
    templates = {info.name: target.templates[info.name] for info in target.record.templates or []}

    data = Input(
        target.structure,
        msas,
        record=target.record,
        residue_constraints=target.residue_constraints,
        templates=templates or None,
        extra_mols=target.extra_mols,
    )
    tokenized = Boltz2Tokenizer().tokenize(data)
    molecules = {**canonicals, **target.extra_mols}
    missing = set(tokenized.tokens["res_name"].tolist()) - set(molecules)
    molecules.update(load_molecules(mols_dir, missing))
    options = target.record.inference_options
    features = Boltz2Featurizer().process(
        tokenized,
        molecules=molecules,
        random=np.random.default_rng(seed),
        training=False,
        max_atoms=None,
        max_tokens=None,
        max_seqs=const.max_msa_seqs,
        pad_to_max_seqs=False,
        single_sequence_prop=0.0,
        compute_frames=True,
        inference_pocket_constraints=options.pocket_constraints if options else None,
        inference_contact_constraints=options.contact_constraints if options else None,
        compute_constraint_features=True,
        override_method=None,
        compute_affinity=False,
    )
    return {key: value for key, value in collate([features]).items() if isinstance(value, torch.Tensor)}


ORACLE_CASES = ("monomer_msa", "dimer_paired_msa", "protein_dna", "protein_ligand", "template", "cyclic_peptide")

TRP_CAGE = "NLYIQWLKDGGPSSGRPPPS"  # 1l2y


def crop_a3m(path: str | Path, columns: int, rows: int) -> list[str]:
    """The first `rows` distinct sequences of an A3M, cut after `columns` match columns
    (insertions, lower case, kept when they precede a kept column)."""
    sequences, current = [], None
    for line in Path(path).read_text().splitlines():
        if line.startswith(">"):
            current = []
            sequences.append(current)
        elif current is not None and not line.startswith(";"):
            current.append(line.strip())
    cropped = []
    for parts in sequences:
        kept, matched = [], 0
        for char in "".join(parts):
            if matched == columns:
                break
            kept.append(char)
            matched += char.isupper() or char == "-"
        row = "".join(kept)
        if row not in cropped:
            cropped.append(row)
        if len(cropped) == rows:
            break
    return cropped


def _paired_csv(rows: list[str], paired: int) -> str:
    """Boltz's paired-MSA CSV: query key 0, the next `paired` rows keys 1.., the rest unpaired (-1)."""
    keys = [str(i) if i <= paired else "-1" for i in range(len(rows))]
    return "key,sequence\n" + "".join(f"{key},{row}\n" for key, row in zip(keys, rows))


def write_case(name: str, directory: str | Path, data_dir: str | Path) -> Path:
    """Write the YAML (and MSA files) of one of ORACLE_CASES into `directory`; returns the YAML path."""
    directory, msas = Path(directory), Path(data_dir) / "msas"
    directory.mkdir(parents=True, exist_ok=True)
    if name == "monomer_msa":
        rows = crop_a3m(msas / "1a00_A_uniref90.a3m", columns=32, rows=48)
        (directory / "a.a3m").write_text("".join(f">{i}\n{row}\n" for i, row in enumerate(rows)))
        spec = [{"protein": {"id": "A", "sequence": rows[0], "msa": "a.a3m"}}]
    elif name == "dimer_paired_msa":
        rows_a = crop_a3m(msas / "1a00_A_uniref90.a3m", columns=24, rows=16)
        rows_b = crop_a3m(msas / "seq2.a3m", columns=20, rows=12)
        (directory / "a.csv").write_text(_paired_csv(rows_a, paired=8))
        (directory / "b.csv").write_text(_paired_csv(rows_b, paired=8))
        spec = [
            {"protein": {"id": "A", "sequence": rows_a[0], "msa": "a.csv"}},
            {"protein": {"id": "B", "sequence": rows_b[0].replace("X", "M"), "msa": "b.csv"}},
        ]
    elif name == "protein_dna":
        spec = [
            {"protein": {"id": "A", "sequence": TRP_CAGE, "msa": "empty"}},
            {"dna": {"id": "B", "sequence": "GCGAATTC"}},
        ]
    elif name == "protein_ligand":
        spec = [
            {"protein": {"id": "A", "sequence": TRP_CAGE, "msa": "empty"}},
            {"ligand": {"id": "B", "ccd": "SAH"}},
        ]
    elif name == "template":
        (directory / "1l2y.cif").write_bytes((Path(data_dir) / "structures" / "1l2y.cif").read_bytes())
        spec = [{"protein": {"id": "A", "sequence": TRP_CAGE, "msa": "empty"}}]
        return _write_yaml(directory / f"{name}.yaml", spec, templates=[{"cif": "1l2y.cif", "chain_id": "A"}])
    elif name == "cyclic_peptide":
        spec = [{"protein": {"id": "A", "sequence": "QLEDSEVEAVAKG", "msa": "empty", "cyclic": True}}]
    else:
        raise ValueError(f"unknown oracle case {name!r}; known: {ORACLE_CASES}")
    return _write_yaml(directory / f"{name}.yaml", spec)


def _write_yaml(path: Path, sequences: list[dict], templates: list[dict] | None = None) -> Path:
    spec: dict[str, Any] = {"version": 1, "sequences": sequences}
    if templates:
        spec["templates"] = templates
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def oss_model(config: Boltz2Config, seed: int = 0) -> Any:
    """OSS Boltz2 (eval mode, fp32 PyTorch path, no steering) with seeded random weights."""
    from boltz.model.models.boltz2 import Boltz2 as OssBoltz2

    model = OssBoltz2(**oss_hyperparameters(config))
    randomize_weights(model, seed)
    return model.eval()
