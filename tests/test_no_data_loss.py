"""Nothing lost: output commands write only their own files, an empty worklist stops the run before
staging, the run builds report.html, and every output honours the umask. A real Snakemake run of the
whole workflow (demo model, CI recipe; conftest's `workflow_run`) is the run directory."""

from __future__ import annotations

import base64
import os
import shutil
import stat
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from demo_workflow import BAD, GOOD, WorkflowRun, fasta, snakemake, write_config
from foldmill.errors import FoldmillError
from foldmill.io.atomic import foreign_files, owned_files, read_ledger, write_text_atomic
from foldmill.outputs.export import ExportOptions, export_passing
from foldmill.outputs.filters import FilterConfig, read_filter_result
from test_fold import foldmill_here as _foldmill


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry under root -> (size, mtime_ns): any write, deletion or replacement changes it."""
    return {
        path.relative_to(root).as_posix(): (path.lstat().st_size, path.lstat().st_mtime_ns)
        for path in root.rglob("*")
    }


@pytest.fixture(scope="module")
def demo_run(workflow_run: WorkflowRun) -> tuple[Path, Path]:
    """(root, outdir) of the finished workflow run."""
    return workflow_run.root, workflow_run.out


def _copy_run(demo_run: tuple[Path, Path], destination: Path) -> Path:
    """A copy of the run directory (times kept), for tests that run the workflow on it again."""
    shutil.copytree(demo_run[1], destination, copy_function=shutil.copy2, symlinks=True)
    return destination


# --- umask and report.html -------------------------------------------------------------------


@pytest.mark.slow
def test_every_run_output_honours_the_umask(demo_run):
    entries = list(demo_run[1].rglob("*"))
    files = [p for p in entries if p.is_file()]
    assert len(files) > 40 and any(p.name == "report.html" for p in files)
    wrong = {p.relative_to(demo_run[1]).as_posix(): oct(stat.S_IMODE(p.stat().st_mode)) for p in files
             if stat.S_IMODE(p.stat().st_mode) != 0o644}  # fmt: skip
    wrong.update({p.relative_to(demo_run[1]).as_posix(): oct(stat.S_IMODE(p.stat().st_mode)) for p in entries
                  if p.is_dir() and stat.S_IMODE(p.stat().st_mode) != 0o755})  # fmt: skip
    assert wrong == {}


class _StrictHTML(HTMLParser):
    """Checks that every element is closed in order; collects images, headings and table cells."""

    VOID = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.images: list[str] = []
        self.cells: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()

    def handle_data(self, data):
        self.text.append(data)
        if self.open and self.open[-1] == "td":
            self.cells.append(data)


@pytest.mark.slow
def test_run_builds_a_self_contained_report_html(demo_run):
    page = (demo_run[1] / "report.html").read_text(encoding="utf-8")
    parser = _StrictHTML()
    parser.feed(page)
    parser.close()
    assert parser.open == [] and page.startswith("<!DOCTYPE html>")
    assert len(parser.images) == 4
    for source in parser.images:
        assert source.startswith("data:image/png;base64,")
        assert base64.b64decode(source.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    text = " ".join(parser.text)
    assert "NOT a trained model" in text  # the demo model is announced
    assert "targets passed the confidence filters" in text
    assert set(GOOD) <= set(parser.cells)
    assert not any(tag in page for tag in ("<script", "<link", "src='http", 'src="http'))  # nothing fetched


# --- output commands refuse what they did not write ---------------------------------------------


@pytest.mark.slow
def test_commands_pointed_at_a_run_directory_refuse_and_delete_nothing(demo_run, tmp_path):
    out = demo_run[1]
    before = _listing(out)
    attempts = {
        "export": ["export", out / "filter", "-o", out, "--tar-gz"],
        "filter": ["filter", out / "summary.tsv", "-o", out],
        "summary": ["summary", *sorted((out / "fold").glob("*.tsv")), "--worklist", out / "worklist/worklist.tsv",
                    "-o", out],
        "report": ["report", out / "filter", "-o", out],
    }  # fmt: skip
    for command, args in attempts.items():
        done = _foldmill(*args)
        assert done.returncode == 2, (command, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, (command, lines)
        assert lines[0].startswith(f"foldmill: error: {out}: holds files foldmill {command} did not write (e.g. ")
        assert "nothing was written" in lines[0]
    # Into another command's directory: the filter tables are not the export's to replace.
    done = _foldmill("export", out / "filter", "-o", out / "filter")
    assert done.returncode == 2 and "(e.g. failed.tsv and 2 more)" in done.stderr
    assert _listing(out) == before


@pytest.mark.slow
def test_a_rerun_replaces_its_own_output_and_refuses_foreign_files(demo_run, tmp_path):
    out = demo_run[1]
    folds = sorted((out / "fold").glob("*.tsv"))
    runs = {
        "summary": ["summary", *folds, "--worklist", out / "worklist/worklist.tsv", "-o", tmp_path / "summary"],
        "filter": ["filter", out / "summary.tsv", "-o", tmp_path / "filter"],
        "export": ["export", out / "filter", "-o", tmp_path / "export", "--tar-gz"],
        "report": ["report", out / "filter", "-o", tmp_path / "report"],
    }
    for command, args in runs.items():
        first = _foldmill(*args)
        assert first.returncode == 0, (command, first.stderr)
        directory = Path(args[args.index("-o") + 1])
        written = _listing(directory)
        assert f".foldmill-{command}" in written
        second = _foldmill(*args)
        assert second.returncode == 0, (command, second.stderr)
        assert set(_listing(directory)) == set(written)  # the same files, rewritten in place
        (directory / "notes.txt").write_text("mine\n")
        kept = _listing(directory)
        third = _foldmill(*args)
        assert third.returncode == 2 and "(e.g. notes.txt)" in third.stderr, (command, third.stderr)
        assert _listing(directory) == kept
    # The archive beside the export replaces only an archive the export wrote (its ledger there lists it).
    (tmp_path / ".foldmill-export").unlink()
    (tmp_path / "export.tar.gz").write_text("not an export\n")
    (tmp_path / "export" / "notes.txt").unlink()
    done = _foldmill(*runs["export"])
    assert done.returncode == 2 and "export.tar.gz" in done.stderr
    assert (tmp_path / "export.tar.gz").read_text() == "not an export\n"


@pytest.mark.slow
def test_the_cli_re_exports_into_the_workflows_export(demo_run, tmp_path):
    """The workflow's export and `foldmill export` are one owner: the CLI may replace the run's export."""
    out = _copy_run(demo_run, tmp_path / "out")
    assert read_ledger(out / "export", "export") >= {"README.md", "manifest.tsv", "summary.tsv"}
    done = _foldmill("export", out / "filter", "-o", out / "export", "--set", "monomer.min_plddt=null")
    assert done.returncode == 0, done.stderr
    assert "| min_plddt (pLDDT) | - | 70 |" in (out / "export/README.md").read_text()


def test_a_failed_export_keeps_the_previous_one(tmp_path):
    """An export that fails half-way (a prediction gone) leaves the previous export as it was, and no scraps."""
    previous = tmp_path / "export"
    previous.mkdir()
    (previous / "README.md").write_text("previous export\n")
    (previous / ".foldmill-export").write_text("README.md\n")
    result = pd.DataFrame([{"target_id": "gone", "passed": True, "prediction_dir": str(tmp_path / "nowhere")}])
    with pytest.raises(FileNotFoundError):
        export_passing(result, previous, FilterConfig.from_config({}), ExportOptions())
    assert (previous / "README.md").read_text() == "previous export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


# --- default thresholds ----------------------------------------------------------------------


@pytest.mark.slow
def test_filter_without_config_applies_the_workflows_thresholds(demo_run, tmp_path):
    out = demo_run[1]
    done = _foldmill("filter", out / "summary.tsv", "-o", tmp_path / "cli")
    assert done.returncode == 0, done.stderr
    cli = read_filter_result(tmp_path / "cli/passed.tsv", tmp_path / "cli/failed.tsv")
    workflow = read_filter_result(out / "filter/passed.tsv", out / "filter/failed.tsv")
    decisions = {name: dict(zip(t["target_id"], zip(t["passed"], t["reason"]))) for name, t in
                 (("cli", cli), ("workflow", workflow))}  # fmt: skip
    assert decisions["cli"] == decisions["workflow"]
    # Both proteins folded, and the sheet's four usable targets; the demo weights give them a pTM far below
    # the default 0.5, so the default thresholds fail them (with no thresholds they would pass).
    folded = set(GOOD) | {"hb_user", "hb_plain", "bad_plain", "template_bad"}
    assert set(workflow.loc[workflow["status"] == "ok", "target_id"]) == folded
    assert all(not decisions["workflow"][t][0] and "pTM" in decisions["workflow"][t][1] for t in folded)


# --- no target left ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("records", "rejected"), [({}, 1), (BAD, 2)], ids=["empty", "all_rejected"])
def test_no_target_left_stops_before_staging_and_keeps_earlier_outputs(demo_run, tmp_path, records, rejected):
    out = _copy_run(demo_run, tmp_path / "out")
    kept = {k: v for k, v in _listing(out).items() if not k.startswith(("worklist", "logs"))}
    inputs = fasta(tmp_path / "input.fasta", records)
    done = snakemake(write_config(tmp_path, "rerun.yaml", [inputs], out))
    assert done.returncode != 0
    console = (done.stdout + done.stderr).splitlines()
    expected = f"foldmill: error: no target left to fold: {rejected} rejected, see {out}/worklist/rejects.tsv"
    assert [line for line in console if "no target left" in line] == [expected]
    assert len(pd.read_csv(out / "worklist/rejects.tsv", sep="\t")) == rejected
    assert not any(f"rule {name}:" in line for line in console for name in ("stage_msas", "stage_templates"))
    after = {k: v for k, v in _listing(out).items() if not k.startswith(("worklist", "logs"))}
    assert after == kept  # export/, report/, report.html, summary, predictions, staged/: untouched


@pytest.mark.slow
def test_the_export_rule_refuses_a_folder_holding_foreign_files(workflow_run, demo_run, tmp_path):
    out = _copy_run(demo_run, tmp_path / "out")
    (out / "export" / "my_notes.txt").write_text("mine\n")
    before = _listing(out / "export")
    # A copied run has no Snakemake records of its params: the new thresholds' rerun is asked for.
    looser = {"monomer": {"min_plddt": 1, "min_ptm": 0.01}}
    config = write_config(tmp_path, "rerun.yaml", workflow_run.inputs, out, filters=looser)
    done = snakemake(config, "--forcerun", "filter")
    assert done.returncode != 0
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "did not write" in line]
    assert lines == [
        f"foldmill: error: {out}/export: holds files foldmill export did not write (e.g. my_notes.txt); "
        "nothing was written: give a new or empty directory"
    ]
    # Snakemake deletes the rule's declared output (the manifest) before the job; nothing else changed.
    after = _listing(out / "export")
    after.pop("manifest.tsv", None)
    before.pop("manifest.tsv")
    assert after == before


def test_export_refuses_a_path_that_is_a_file(tmp_path):
    (tmp_path / "export").write_text("a file\n")
    with pytest.raises(FoldmillError, match="exists and is not a directory"):
        export_passing(pd.DataFrame(columns=["passed"]), tmp_path / "export", FilterConfig.from_config({}),
                       ExportOptions())  # fmt: skip
    assert (tmp_path / "export").read_text() == "a file\n"
    assert os.listdir(tmp_path) == ["export"]


# --- the mechanism itself (foldmill.io.atomic) ----------------------------------------------------


def test_atomic_writes_take_the_umask(tmp_path):
    previous = os.umask(0o027)
    try:
        write_text_atomic(tmp_path / "a.txt", "x")
        with owned_files([tmp_path / "b.tsv"], "filter", exclusive=False) as (temporary,):
            temporary.write_text("y")
    finally:
        os.umask(previous)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"a.txt": 0o640, "b.tsv": 0o640, ".foldmill-filter": 0o640}


def test_an_interrupted_write_keeps_the_old_files_and_stays_the_commands(tmp_path):
    with owned_files([tmp_path / "passed.tsv", tmp_path / "failed.tsv"], "filter") as temporaries:
        for temporary in temporaries:
            temporary.write_text("first\n")
    with pytest.raises(KeyboardInterrupt):
        with owned_files([tmp_path / "passed.tsv", tmp_path / "failed.tsv"], "filter") as temporaries:
            temporaries[0].write_text("second\n")
            raise KeyboardInterrupt
    assert {p.name: p.read_text() for p in tmp_path.iterdir() if not p.name.startswith(".")} == {
        "passed.tsv": "first\n", "failed.tsv": "first\n",
    }  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == [".foldmill-filter", "failed.tsv", "passed.tsv"]
    # A temporary file a killed process left behind is ours, not a reason to refuse.
    (tmp_path / f".passed.tsv.{'0' * 32}.tmp").write_text("scrap")
    assert foreign_files(tmp_path, "filter") == []
    (tmp_path / "sub").mkdir()
    assert foreign_files(tmp_path, "filter") == [tmp_path / "sub"]
    assert foreign_files(tmp_path, "export") == [tmp_path / ".foldmill-filter", tmp_path / "failed.tsv",
                                                 tmp_path / "passed.tsv", tmp_path / "sub"]  # fmt: skip
