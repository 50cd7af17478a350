"""Shared test fixtures and the GPU skip rule."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def database(tmp_path_factory: pytest.TempPathFactory):
    """The small ColabFold-format databases of the MSA tests (tests/colabfold_db.py), built once."""
    import colabfold_db
    from foldmill.msa import colabfold
    from foldmill.msa.mmseqs import mmseqs_binary

    root = colabfold_db.build_test_databases(mmseqs_binary(), tmp_path_factory.mktemp("colabfold"))
    return colabfold.ColabFoldDatabases.find(root)


@pytest.fixture(scope="session")
def workflow_run(tmp_path_factory: pytest.TempPathFactory):
    """A finished real Snakemake run of the whole workflow, shared by the modules that read one
    (tests/demo_workflow.py says what it folds)."""
    import demo_workflow

    return demo_workflow.run_workflow(tmp_path_factory.mktemp("workflow_run"), DATA)
