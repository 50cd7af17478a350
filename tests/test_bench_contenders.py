"""The MoE bench's report header names the optional libraries without importing those that must
be imported last (bench/moe.py IMPORTED_LAST: Transformer Engine loads a cuDNN of its own)."""

from __future__ import annotations

import sys

from foldmill.bench.moe import IMPORTED_LAST, available_contenders


def test_libraries_imported_last_are_named_by_version_without_being_imported(tmp_path, monkeypatch):
    name = IMPORTED_LAST[0]
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    metadata = tmp_path / f"{name}-1.2.3.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    found = available_contenders()

    assert found[name] == "1.2.3 (imported after the other rows)"
    assert name not in sys.modules


def test_a_missing_library_imported_last_is_reported_as_not_installed(monkeypatch):
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if "site-packages" not in entry])
    assert available_contenders()[IMPORTED_LAST[0]] == "not installed"


def test_a_library_without_a_version_attribute_is_named_by_its_distribution(tmp_path, monkeypatch):
    """flash-attn-4 installs flash_attn as a namespace package, without __version__."""
    (tmp_path / "nsattn" / "cute").mkdir(parents=True)
    metadata = tmp_path / "ns_attn_4-4.0.0.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: ns-attn-4\nVersion: 4.0.0\n")
    (metadata / "top_level.txt").write_text("nsattn\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("foldmill.bench.moe.CONTENDER_MODULES", ("nsattn",))

    assert available_contenders() == {"nsattn": "ns-attn-4 4.0.0"}


def test_a_version_attribute_that_is_not_a_version_gives_way_to_the_distribution(tmp_path, monkeypatch):
    """The CUTLASS DSL's front end built from source keeps its build template as __version__."""
    (tmp_path / "tmplgemm").mkdir()
    (tmp_path / "tmplgemm" / "__init__.py").write_text('__version__ = "@TMPLGEMM_RELEASE_VERSION@"\n')
    metadata = tmp_path / "tmpl_gemm-4.7.0.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: tmpl-gemm\nVersion: 4.7.0\n")
    (metadata / "top_level.txt").write_text("tmplgemm\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("foldmill.bench.moe.CONTENDER_MODULES", ("tmplgemm",))

    assert available_contenders() == {"tmplgemm": "tmpl-gemm 4.7.0"}
