"""The foldmill command itself."""

from __future__ import annotations

import subprocess
import sys


def run_foldmill(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "foldmill", *args], capture_output=True, text=True)


def test_doctor_reports_the_environment() -> None:
    done = run_foldmill("doctor")
    assert done.returncode == 0, done.stderr
    found = dict(line.split(None, 1) for line in done.stdout.strip().splitlines())
    import ray
    import torch

    assert found["torch"] == torch.__version__
    assert found["ray"] == ray.__version__
    assert "cuda" in done.stdout and "slurm" in found and "mmseqs" in found


def test_doctor_names_a_command_that_is_installed_but_fails() -> None:
    # as Slurm's sinfo does on a machine outside any cluster: its last line says why
    from foldmill.runtime.doctor import _command_version

    failing = [sys.executable, "-c", "import sys; print('first', file=sys.stderr); sys.exit('no configuration')"]
    assert _command_version(failing) == f"installed, but `{' '.join(failing)}` fails: no configuration"
    assert _command_version([sys.executable, "--version"]).startswith("Python 3.")


def test_every_subcommand_has_help(capsys) -> None:
    """In this process: a `foldmill` start-up per subcommand costs seconds of imports each (the entry
    point itself runs in the other tests here)."""
    import argparse

    import pytest

    from foldmill.cli import build_parser, main

    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    listed = list(actions[0].choices)
    assert {"worklist", "doctor", "bench"} <= set(listed)
    for command in listed:
        with pytest.raises(SystemExit) as exited:
            main([command, "--help"])
        assert exited.value.code == 0, command
        printed = capsys.readouterr()
        assert printed.out.startswith(f"usage: foldmill {command} ") and printed.err == "", command


def test_only_the_command_run_is_imported() -> None:
    """`foldmill worklist` or `foldmill --help` must not pay seconds for torch, which only the
    fold, bench and pretrain paths need."""
    script = (
        "import sys\n"
        "from foldmill.cli import main\n"
        "code = main(['worklist', '/nonexistent/input.fasta', '-o', '/nonexistent/out'])\n"
        "print(code, sorted(m for m in ('torch', 'foldmill.cli.fold', 'foldmill.cli.bench') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.stdout == "2 []\n", done.stdout + done.stderr
    listing = run_foldmill("--help")
    assert listing.returncode == 0 and "  fold " in listing.stdout and "  bench " in listing.stdout, listing.stdout


def test_listed_help_is_each_commands_own() -> None:
    """The help `foldmill --help` reads from a module's source is the help its parser registers."""
    import argparse

    from foldmill.cli import build_parser

    def helps(parser: argparse.ArgumentParser) -> dict[str, str]:
        (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return {choice.dest: choice.help for choice in commands._choices_actions}

    listed, registered = helps(build_parser([])), helps(build_parser())
    assert listed == registered
    assert registered["worklist"].startswith("build a validated worklist") and all(registered.values())


def test_missing_input_is_one_line() -> None:
    done = run_foldmill("worklist", "/nonexistent/input.fasta", "-o", "/tmp/unused")
    assert done.returncode == 2
    assert done.stderr == "foldmill: error: /nonexistent/input.fasta: input does not exist\n"


def test_subcommand_with_missing_dependency_says_so(tmp_path, monkeypatch) -> None:
    """A subcommand whose module needs an absent package fails in one line; the others still work."""
    package = tmp_path / "fake_commands"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "needs_absent.py").write_text("import foldmill_absent_dependency\n")
    (package / "works.py").write_text(
        "def register(subparsers):\n"
        "    subparsers.add_parser('works').set_defaults(handler=lambda args: 0)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import argparse

    import pytest

    from foldmill.cli import register_modules
    from foldmill.errors import FoldmillError

    parser = argparse.ArgumentParser()
    register_modules("fake_commands", parser.add_subparsers(dest="command", required=True))
    assert parser.parse_args(["works"]).handler(None) == 0
    args, ignored = parser.parse_known_args(["needs_absent", "--device", "cuda"])
    assert ignored == ["--device", "cuda"] and args.accepts_any_arguments
    with pytest.raises(FoldmillError, match="needs the Python package 'foldmill_absent_dependency'"):
        args.handler(args)


def test_bench_checkpoint_that_is_not_weights_is_one_line(tmp_path, capsys) -> None:
    from foldmill.cli import main

    junk = tmp_path / "weights.ckpt"
    junk.write_text("not weights")
    assert main(["bench", "forward", "--device", "cpu", "--checkpoint", str(junk), "--out", str(tmp_path / "o")]) == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith(f"foldmill: error: {junk}: ") and stderr.count("\n") == 1, stderr


def test_bench_throughput_side_without_oss_is_one_line(tmp_path, capsys) -> None:
    from foldmill.cli import main

    args = ["bench", "throughput", "--device", "cpu", "--side", "oss", "--targets", "2", "--out", str(tmp_path)]
    assert main(args) == 2
    stderr = capsys.readouterr().err
    assert stderr == "foldmill: error: --side splits the comparison with OSS: it needs --oss\n", stderr


def test_usage_errors_are_one_line_pointing_to_help() -> None:
    """A mistyped option or value gets one line, not argparse's usage text (30 lines for
    `foldmill pretrain train`)."""
    for args, command in ((["pretrain", "train", "--corpus", "c", "--run-dir", "r", "--steps", "x"], "foldmill pretrain train"),
                          (["worklist"], "foldmill worklist"),
                          (["nosuch"], "foldmill")):
        done = run_foldmill(*args)
        assert done.returncode == 2 and done.stdout == "", args
        assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"{command}: error: "), done.stderr
        assert done.stderr.endswith(f"(see {command} --help)\n"), done.stderr
