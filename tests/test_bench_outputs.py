"""Benchmarks write their raw outputs to --out, whose default stays out of the repository's history."""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import signal
import subprocess
from pathlib import Path

import pytest

import foldmill.bench
from foldmill.errors import FoldmillError

REPO = Path(__file__).resolve().parents[1]
BENCHES = sorted(m.name for m in pkgutil.iter_modules(foldmill.bench.__path__) if not m.name.startswith("_"))


def default_out(name: str) -> Path:
    module = importlib.import_module(f"foldmill.bench.{name}")
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers(dest="bench")
    module.register(subparsers)
    command = name.replace("_", "-")  # module moe_parity is `foldmill bench moe-parity`
    required = [a.option_strings[0] for a in subparsers.choices[command]._actions if a.required and a.option_strings]
    return Path(parser.parse_args([command, *(part for option in required for part in (option, "x"))]).out)


@pytest.mark.parametrize("name", BENCHES)
def test_default_out_is_a_git_ignored_folder_of_the_checkout(name: str) -> None:
    out = default_out(name)
    assert not out.is_absolute(), out
    ignored = subprocess.run(["git", "check-ignore", "-q", str(out / "forward_bench.json")], cwd=REPO, check=False)
    assert ignored.returncode == 0, f"foldmill bench {name} writes to {out}, which git would track"


# --- what a benchmark may write in --out (foldmill.bench._out_dir) -------------------------------


def _bench(out: Path, write: dict[str, str], stop: bool = False):
    """A benchmark handler that writes `write` into --out, then ends or gets SIGTERM."""
    from foldmill.bench._out_dir import writes_only_its_own

    def run(args: argparse.Namespace) -> int:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        for name, text in write.items():
            (Path(args.out) / name).write_text(text)
        if stop:
            os.kill(os.getpid(), signal.SIGTERM)
        return 0

    return writes_only_its_own(run)(argparse.Namespace(out=str(out)))


def test_a_benchmark_refuses_an_out_holding_files_it_did_not_write(tmp_path, capsys):
    from foldmill.cli import main

    out = tmp_path / "out"
    out.mkdir()
    (out / "planning.md").write_text("my notes\n")
    assert main(["bench", "planning", "--shards", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"foldmill: error: {out}: holds files foldmill bench did not write (e.g. planning.md); " \
                  "nothing was written: give a new or empty directory\n"
    assert [path.name for path in out.iterdir()] == ["planning.md"]
    assert (out / "planning.md").read_text() == "my notes\n"


def test_a_benchmark_replaces_its_own_files_even_after_sigterm(tmp_path):
    out = tmp_path / "out"
    assert _bench(out, {"moe_bench.json": "1"}) == 0
    assert _bench(out, {"moe_bench.json": "2", "moe_bench.md": "2"}) == 0
    with pytest.raises(SystemExit):  # a Slurm time limit: the files written so far are listed
        _bench(out, {"partial.json": "3"}, stop=True)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert _bench(out, {"partial.json": "4"}) == 0
    assert {path.name: path.read_text() for path in out.iterdir() if not path.name.startswith(".")} == {
        "moe_bench.json": "2", "moe_bench.md": "2", "partial.json": "4"}


def test_a_benchmarks_out_from_before_the_ledger_is_its_own(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "moe_bench.json").write_text("earlier\n")
    (out / "moe_bench.md").write_text("earlier\n")
    assert _bench(out, {"moe_bench.json": "new"}) == 0
    assert (out / "moe_bench.json").read_text() == "new"
    # not a report of a benchmark: a user's directory
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "moe_bench.md").write_text("mine\n")
    with pytest.raises(FoldmillError, match="did not write"):
        _bench(mine, {"moe_bench.md": "new"})
    assert (mine / "moe_bench.md").read_text() == "mine\n"
