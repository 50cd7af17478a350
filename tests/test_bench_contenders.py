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


def _install(tmp_path, module: str, distribution: str, version: str, init: str | None) -> None:
    """Put a package `module` (a namespace package when `init` is None) and the dist-info of
    `distribution` that installs it on sys.path."""
    (tmp_path / module).mkdir()
    if init is not None:
        (tmp_path / module / "__init__.py").write_text(init)
    metadata = tmp_path / f"{distribution.replace('-', '_')}-{version}.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    (metadata / "top_level.txt").write_text(f"{module}\n")


def test_a_library_without_a_version_attribute_is_named_by_its_distribution(tmp_path, monkeypatch):
    """flash-attn-4 installs flash_attn as a namespace package, without __version__."""
    _install(tmp_path, "nsattn", "ns-attn-4", "4.0.0", init=None)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("foldmill.bench.moe.CONTENDER_MODULES", ("nsattn",))

    assert available_contenders() == {"nsattn": "ns-attn-4 4.0.0"}


def test_a_version_attribute_that_is_not_a_version_gives_way_to_the_distribution(tmp_path, monkeypatch):
    """The CUTLASS DSL's front end built from source keeps its build template as __version__."""
    _install(tmp_path, "tmplgemm", "tmpl-gemm", "4.7.0", init='__version__ = "@TMPLGEMM_RELEASE_VERSION@"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("foldmill.bench.moe.CONTENDER_MODULES", ("tmplgemm",))

    assert available_contenders() == {"tmplgemm": "tmpl-gemm 4.7.0"}
