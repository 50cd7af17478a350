"""The ColabFold MSA server client over real HTTP, against a local server process (tests/msa_server_app.py)
that implements the same API and answers with real ColabFold-protocol searches of a small
ColabFold-format database built from the UniRef sequences of tests/data/msas."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from foldmill.errors import FoldmillError
from foldmill.msa import colabfold, server
from foldmill.msa.staging import MSAStagingConfig, stage_msas

REPO = Path(__file__).resolve().parents[1]
MSAS = REPO / "tests" / "data" / "msas"
APP = REPO / "tests" / "msa_server_app.py"
HEMOGLOBIN_BETA = (
    "VHLTPEEKSAVTALWGKVNVDEVGGEALGRLLVVYPWTQRFFESFGDLSTPDAVMGNPKVKAHGKKVLGAFSDGLAHLDNLKGTFATLSELHCDKLHVDPENFRLL"
    "GNVLVCVLAHHFGKEFTPPVQAAYQKVVAGVANALAHKYH"
)
NO_HIT = "MSTTASTPSSLRHLISIKDLSDEEFRILVQRAQHFKNVFKANKTN"  # a yeast peptide without homologs in the database
# The local protocol pairs UniRef30 hits only (as colabfold_search does), so the tests ask for that.
FAST = server.ServerSettings(
    poll_interval=0.05, backoff=0.01, backoff_cap=0.05, retries=4, timeout=30, pair_environmental=False
)


def query_of(a3m: Path) -> str:
    lines = a3m.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(">"))
    return lines[first + 1].strip()


def python_environment() -> dict[str, str]:
    """This checkout's sources first, for the subprocesses."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}


@contextmanager
def running_server(database: colabfold.ColabFoldDatabases, workdir: Path) -> Iterator[str]:
    """The test server in a subprocess on 127.0.0.1; yields its URL, stops it on exit."""
    process = subprocess.Popen(
        [sys.executable, str(APP), str(database.root), str(workdir), "--lifetime", "1200"],
        stdout=subprocess.PIPE, text=True, env=python_environment(),
    )  # fmt: skip
    try:
        ready, _, _ = select.select([process.stdout], [], [], 60)
        line = process.stdout.readline() if ready else ""
        assert line.startswith("PORT "), f"test server did not start: {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def served(database, tmp_path_factory) -> colabfold.ColabFoldDatabases:
    """The test databases (links) plus the environmental one under an environmental pairing name
    (it has the taxonomy mapping pairing needs), so the server answers the -env pairing modes."""
    root = tmp_path_factory.mktemp("served")
    for path in database.root.iterdir():
        (root / path.name).symlink_to(path)
        if path.name.startswith(database.environmental):
            (root / path.name.replace(database.environmental, "spire_test_db", 1)).symlink_to(path)
    return colabfold.ColabFoldDatabases.find(root)


@pytest.fixture(scope="module")
def url(served, tmp_path_factory) -> Iterator[str]:
    with running_server(served, tmp_path_factory.mktemp("msa_server")) as address:
        yield address


def control(url: str, **switches: object) -> None:
    data = urllib.parse.urlencode({"reset": 1, **switches}).encode()
    urllib.request.urlopen(f"{url}/control", data=data, timeout=10).read()


def stats(url: str) -> dict[str, int]:
    return json.loads(urllib.request.urlopen(f"{url}/stats", timeout=10).read())


def test_unpaired_and_paired_msas_equal_the_local_colabfold_search(url, database, tmp_path):
    control(url)
    alpha = query_of(MSAS / "1a00_A_uniref90.a3m")
    sequences = {
        "alpha": alpha, "beta": HEMOGLOBIN_BETA, "seq1": query_of(MSAS / "seq1.a3m"),
        "seq2": query_of(MSAS / "seq2.a3m"), "nohit": NO_HIT, "seq1_again": query_of(MSAS / "seq1.a3m"),
    }  # fmt: skip
    complexes = {"hemoglobin": [alpha, HEMOGLOBIN_BETA, alpha], "homodimer": [sequences["seq1"]] * 2}
    settings = replace(FAST, url=url, batch_size=2, concurrency=2)

    unpaired, paired = server.search(sequences, complexes, tmp_path / "cache", settings)

    local_unpaired, local_paired = colabfold.search(
        sequences, complexes, database, tmp_path / "local", colabfold.ColabFoldSettings(threads=2)
    )
    assert unpaired == local_unpaired
    assert paired == local_paired
    assert list(paired) == ["hemoglobin"]  # a homodimer needs no pairing
    assert unpaired["alpha"].count(">") > 1000  # UniRef30 and environmental rows
    assert unpaired["nohit"] == f">101\n{NO_HIT}\n>101\n{NO_HIT}\n"  # each database's query row, no hits
    rows = [a3m.count(">") for a3m in paired["hemoglobin"]]
    assert rows[0] == rows[1] > 100
    # 5 distinct sequences in tickets of 2, and one pairing ticket for the heterodimer
    assert stats(url)["submitted"] == 4

    assert server.search(sequences, complexes, tmp_path / "cache", settings) == (unpaired, paired)
    assert stats(url)["submitted"] == 4  # the rerun read the cache


def test_a_rerun_with_the_server_gone_reads_the_cache(database, tmp_path):
    sequences = {"seq2": query_of(MSAS / "seq2.a3m")}
    with running_server(database, tmp_path / "server") as address:
        settings = replace(FAST, url=address, retries=1)
        first = server.search(sequences, {}, tmp_path / "cache", settings)
    assert first[0]["seq2"].count(">") > 10
    assert server.search(sequences, {}, tmp_path / "cache", settings) == first
    with pytest.raises(server.ServerError, match="unreachable"):
        server.search(sequences, {}, tmp_path / "other_cache", settings)


def test_rate_limits_are_waited_out(url, tmp_path):
    control(url, ratelimit=2)
    unpaired, _ = server.search({"peptide": NO_HIT}, {}, tmp_path, replace(FAST, url=url))
    assert unpaired["peptide"] == f">101\n{NO_HIT}\n>101\n{NO_HIT}\n"
    assert stats(url) == {"submitted": 1, "ratelimited": 2, "failed": 0, "downloads": 1}


def test_a_rate_limit_that_does_not_end_is_one_line(url, tmp_path):
    control(url, ratelimit=10)
    with pytest.raises(server.ServerError) as error:
        server.search({"peptide": NO_HIT}, {}, tmp_path, replace(FAST, url=url, retries=3))
    assert str(error.value) == f"{url}: still RATELIMIT after 3 attempts"


def test_429_and_5xx_answers_are_retried(url, tmp_path):
    control(url, fail="503,429,500")  # the submission twice, then the first status check
    unpaired, _ = server.search({"peptide": NO_HIT}, {}, tmp_path, replace(FAST, url=url))
    assert unpaired["peptide"].startswith(f">101\n{NO_HIT}\n")
    assert stats(url)["failed"] == 3
    assert stats(url)["submitted"] == 1


def test_an_unreachable_server_is_one_line_naming_the_url(tmp_path):
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"http://127.0.0.1:{port}"
    with pytest.raises(server.ServerError) as error:
        server.search({"peptide": NO_HIT}, {}, tmp_path, replace(FAST, url=address, retries=2))
    message = str(error.value)
    assert message.startswith(f"{address}/ticket/msa: MSA server unreachable (")
    assert message.endswith("after 2 attempts")
    assert "\n" not in message


def test_an_error_ticket_costs_only_its_queries_and_is_resubmitted_by_a_rerun(url, tmp_path):
    control(url, error=1)
    settings = replace(FAST, url=url, batch_size=1, concurrency=1)
    sequences = {"first": NO_HIT, "second": NO_HIT[:-5]}

    unpaired, _, problems = server.search_each(sequences, {}, tmp_path, settings)

    assert list(unpaired) == ["second"]
    assert list(problems) == ["first"]
    assert problems["first"].startswith(f"{url}: ticket ")
    assert problems["first"].endswith("failed on the server (status ERROR)")
    control(url, error=1)  # the counters start again from zero
    with pytest.raises(server.ServerError, match=r"^\S+: ticket \w+ failed on the server \(status ERROR\)$"):
        server.search(sequences, {}, tmp_path, settings)
    assert stats(url)["submitted"] == 1  # only the failed query went out again

    control(url)
    unpaired, _ = server.search(sequences, {}, tmp_path, settings)
    assert unpaired["first"].startswith(f">101\n{NO_HIT}\n")
    assert stats(url)["submitted"] == 1


def test_a_refused_batch_is_split_so_only_the_bad_query_fails(url, tmp_path):
    control(url)
    settings = replace(FAST, url=url, batch_size=3)
    sequences = {"good": NO_HIT, "bad": "MKV1234", "also_good": NO_HIT[:-5]}

    unpaired, _, problems = server.search_each(sequences, {}, tmp_path, settings)

    assert sorted(unpaired) == ["also_good", "good"]
    assert problems == {"bad": f"{url}: ticket/msa refused the query (status ERROR)"}
    assert stats(url)["submitted"] == 2  # the batch was refused, then each sequence went out alone


def interrupt_a_search(url: str, cache: Path, request_timeout: float = 60.0) -> None:
    """Start a search of NO_HIT in another process, press Ctrl-C once its ticket is saved (while it
    polls), and check that it stops within 30 s with KeyboardInterrupt."""
    script = (
        # Ctrl-C as in a terminal, even where the tests run with SIGINT ignored (a background job).
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from foldmill.msa import server; "
        f"settings = server.ServerSettings(url={url!r}, poll_interval=0.05, timeout={request_timeout}); "
        f"server.search({{'peptide': {NO_HIT!r}}}, {{}}, sys.argv[1], settings)"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(cache)], stderr=subprocess.PIPE, text=True, env=python_environment()
    )
    for _ in range(600):  # the ticket is saved before it is polled
        if list(cache.glob("colabfold-server-*/tickets/*.json")) or process.poll() is not None:
            break
        time.sleep(0.1)
    time.sleep(0.5)  # polling
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) != 0
    assert "KeyboardInterrupt" in process.stderr.read()


def test_an_interrupted_run_keeps_its_ticket_for_the_next(url, tmp_path):
    control(url, stuck=1)
    interrupt_a_search(url, tmp_path)
    assert len(list(tmp_path.glob("colabfold-server-*/tickets/*.json"))) == 1

    urllib.request.urlopen(f"{url}/control", data=b"stuck=0", timeout=10).read()
    unpaired, _ = server.search({"peptide": NO_HIT}, {}, tmp_path, replace(FAST, url=url))
    assert unpaired["peptide"] == f">101\n{NO_HIT}\n>101\n{NO_HIT}\n"
    assert stats(url)["submitted"] == 1


def test_ctrl_c_stops_a_run_whose_server_hangs_without_waiting_out_the_request(url, tmp_path):
    """A status request that gets no answer holds up neither the interrupt nor the saved ticket:
    the run stops within 30 s although each request may wait 10 minutes."""
    control(url, stall=1)
    try:
        interrupt_a_search(url, tmp_path, request_timeout=600.0)
    finally:
        control(url, stall=0)
    assert len(list(tmp_path.glob("colabfold-server-*/tickets/*.json"))) == 1


def test_a_refused_query_is_one_line(url, tmp_path):
    control(url)
    with pytest.raises(server.ServerError, match=r"ticket/msa refused the query \(status ERROR\)$"):
        server.search({"bad": "MKV1234"}, {}, tmp_path, replace(FAST, url=url))


def test_a_stuck_ticket_gives_up_and_a_rerun_polls_the_same_ticket(url, tmp_path):
    control(url, stuck=1)
    settings = replace(FAST, url=url, max_wait=0.5)
    with pytest.raises(server.ServerError, match=r"ticket \w+ still RUNNING after \d+ s \(rerun to keep waiting"):
        server.search({"peptide": NO_HIT}, {}, tmp_path, settings)
    assert stats(url)["submitted"] == 1
    tickets = list(tmp_path.glob("colabfold-server-*/tickets/*.json"))
    assert len(tickets) == 1

    urllib.request.urlopen(f"{url}/control", data=b"stuck=0", timeout=10).read()
    unpaired, _ = server.search({"peptide": NO_HIT}, {}, tmp_path, replace(settings, max_wait=600))
    assert unpaired["peptide"].startswith(f">101\n{NO_HIT}\n")
    assert stats(url)["submitted"] == 1  # the same ticket, polled again
    assert not tickets[0].exists()


def test_a_ticket_the_server_forgot_is_submitted_again(url, tmp_path):
    control(url, stuck=1)
    settings = replace(FAST, url=url, max_wait=0.3)
    with pytest.raises(server.ServerError, match="still RUNNING"):
        server.search({"peptide": NO_HIT}, {}, tmp_path, settings)
    assert len(list(tmp_path.glob("colabfold-server-*/tickets/*.json"))) == 1

    control(url, forget=1)  # a restarted server: the saved ticket is UNKNOWN there
    unpaired, _ = server.search({"peptide": NO_HIT}, {}, tmp_path, replace(settings, max_wait=600))
    assert unpaired["peptide"] == f">101\n{NO_HIT}\n>101\n{NO_HIT}\n"
    assert stats(url)["submitted"] == 1
    assert not list(tmp_path.glob("colabfold-server-*/tickets/*.json"))


def test_malformed_results_are_one_line(url, tmp_path):
    control(url, malformed=1)
    settings = replace(FAST, url=url)
    with pytest.raises(server.ServerError, match=r"result of ticket \w+ is not a tar.gz"):
        server.search({"peptide": NO_HIT}, {}, tmp_path / "a", settings)

    control(url, drop=1)
    with pytest.raises(server.ServerError) as error:
        server.search({"peptide": NO_HIT, "shorter": NO_HIT[:-5]}, {}, tmp_path / "b", settings)
    lacking = f"{url}: uniref.a3m lacks the MSA of query >102"
    assert str(error.value) == f"{lacking} (2 sequence and complex ids without an MSA)"


def test_settings_are_checked():
    with pytest.raises(FoldmillError, match="msa.server_url must be an http"):
        server.ServerSettings(url="api.colabfold.com")
    with pytest.raises(FoldmillError, match="msa.server_pairing must be one of greedy, complete"):
        server.ServerSettings(pairing_strategy="best")
    assert server.ServerSettings().unpaired_mode() == "env"
    assert server.ServerSettings(use_environmental=False, filter=False).unpaired_mode() == "nofilter"
    assert server.ServerSettings().paired_mode() == "pairgreedy-env"  # what boltz --use_msa_server asks
    assert server.ServerSettings(pairing_strategy="complete", pair_environmental=False).paired_mode() == "paircomplete"

    settings = server.ServerSettings.from_config(
        {"server_url": "http://127.0.0.1:8080/", "server_concurrency": 3, "server_pairing": "complete"}
    )
    assert settings.base_url == "http://127.0.0.1:8080"
    assert (settings.concurrency, settings.paired_mode()) == (3, "paircomplete-env")
    assert settings.batch_size == server.ServerSettings().batch_size
    with pytest.raises(FoldmillError, match="msa.server_concurrency must be an integer, not 'many'"):
        server.ServerSettings.from_config({"server_concurrency": "many"})
    with pytest.raises(FoldmillError, match="msa.server_environmental must be true or false, not 'no'"):
        server.ServerSettings.from_config({"server_environmental": "no"})


def test_staging_in_server_mode_rejects_only_what_the_server_refuses(url, database, tmp_path):
    control(url)
    alpha = query_of(MSAS / "1a00_A_uniref90.a3m")
    chains = tmp_path / "unique_chains.tsv"
    chains.write_text(
        "chain_hash\tentity_type\tmsa\tsequence\n"
        f"{'a' * 64}\tprotein\t\t{alpha}\n{'b' * 64}\tprotein\t\t{NO_HIT}\n{'c' * 64}\tprotein\t\tMKV1234\n"
    )
    config = MSAStagingConfig.from_config({"mode": "server", "server_url": url, "server_batch_size": 3})
    config = replace(config, server=replace(FAST, url=url, batch_size=3))
    staged = tmp_path / "staged"
    result = stage_msas(chains, staged / "msa_manifest.tsv", config, rejects_path=staged / "msa_rejects.tsv")

    depths = dict(zip(result.manifest["chain_hash"], result.manifest["depth"]))
    local, _ = colabfold.search({"alpha": alpha}, {}, database, tmp_path / "local", colabfold.ColabFoldSettings())
    rows = [line.upper().replace("-", "") for line in local["alpha"].splitlines() if not line.startswith(">")]
    assert depths == {"a" * 64: len(dict.fromkeys(rows)), "b" * 64: 1}
    assert list(result.rejects["chain_hash"]) == ["c" * 64]
    assert result.rejects["problem"].iloc[0] == f"{url}: ticket/msa refused the query (status ERROR)"
    assert set(result.manifest["source"]) == {"server"} and set(result.manifest["protocol"]) == {"colabfold"}

    again = stage_msas(chains, staged / "msa_manifest.tsv", config, rejects_path=staged / "msa_rejects.tsv")
    assert again.searched == 1  # only the refused one is asked again; the rest come from the cache


def test_a_heterodimer_staged_in_server_mode_pairs_uniref_and_environmental_hits(url, served, tmp_path):
    """foldmill's server mode end to end over HTTP with its default pairing mode (pairgreedy-env, as
    `boltz predict --use_msa_server` asks): each chain's paired A3M is UniRef30's pairing followed
    by the environmental pairing database's, each as the local search gives it, and both chains are
    staged with their paired rows."""
    import msa_server_app
    from foldmill.io.worklist import build_worklist, write_worklist

    control(url)
    alpha = query_of(MSAS / "1a00_A_uniref90.a3m")
    (tmp_path / "targets.tsv").write_text(
        f"target_id\tentity_type\tsequence\tmsa\tchain_ids\nhb\tprotein\t{alpha}\t\tA\n"
        f"hb\tprotein\t{HEMOGLOBIN_BETA}\t\tB\n"
    )
    write_worklist(build_worklist([tmp_path / "targets.tsv"]), tmp_path / "worklist", True)
    config = MSAStagingConfig.from_config({"mode": "server", "server_url": url, "cache_dir": str(tmp_path / "cache")})
    assert config.server.paired_mode() == "pairgreedy-env"
    config = replace(config, server=replace(FAST, url=url, pair_environmental=True))
    staged = tmp_path / "staged"
    result = stage_msas(tmp_path / "worklist" / "unique_chains.tsv", staged / "msa_manifest.tsv", config,
                        tmp_path / "worklist" / "worklist.tsv", staged / "msa_rejects.tsv")  # fmt: skip

    assert result.rejects.empty
    paired = result.manifest[result.manifest["complex"] != ""]
    assert len(paired) == 2 and set(paired["source"]) == {"server"}
    answered = server.ServerCache(tmp_path / "cache" / "server", config.server).paired([alpha, HEMOGLOBIN_BETA])
    environmental = colabfold.paired_msas([[alpha, HEMOGLOBIN_BETA]], msa_server_app.environmental_pairing(served.root),
                                          tmp_path / "local", colabfold.ColabFoldSettings(threads=2))[0]  # fmt: skip
    for position, (a3m, extra) in enumerate(zip(answered, environmental)):
        assert a3m.startswith(f">{101 + position}\n") and a3m.endswith(extra) and len(a3m) > len(extra)
        assert extra.count(">") > 10  # the environmental database pairs these chains too
    # every non-gap paired row of a chain reached its staged MSA (row i of both from one species)
    rows = [sum(1 for line in a3m.splitlines()[1::2] if set(line) != {"-"}) for a3m in answered]
    assert sorted(paired["paired_rows"]) == sorted(rows) and min(rows) > 10


@pytest.mark.parametrize("on_failure", ["reject", "fallback"])
def test_staging_with_an_unreachable_server_loses_no_target(tmp_path, on_failure):
    """Nothing listens there: one line naming the URL per chain; rejected, or (msa.on_failure:
    fallback) folded from the sequence alone with that line as the note."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    chains = tmp_path / "unique_chains.tsv"
    chains.write_text(f"chain_hash\tentity_type\tmsa\tsequence\n{'a' * 16}\tprotein\t\t{NO_HIT}\n")
    section = {"mode": "server", "server_url": dead, "server_retries": 1, "on_failure": on_failure}
    staged = tmp_path / "staged"
    result = stage_msas(chains, staged / "msa_manifest.tsv", MSAStagingConfig.from_config(section),
                        rejects_path=staged / "msa_rejects.tsv")  # fmt: skip
    line = f"{dead}/ticket/msa: MSA server unreachable"
    if on_failure == "reject":
        assert result.manifest.empty and result.rejects["problem"].iloc[0].startswith(line)
        assert result.rejects["source"].iloc[0] == dead
    else:
        assert result.rejects.empty and result.manifest["source"].tolist() == ["fallback"]
        assert result.manifest["note"].iloc[0].startswith(line) and "\n" not in result.manifest["note"].iloc[0]
