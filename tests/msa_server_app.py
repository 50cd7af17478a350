"""A local ColabFold MSA server for the tests: the API foldmill.msa.server calls, answered with real
searches by foldmill.msa.colabfold (ColabFold's protocol) against a ColabFold-format database.

    python tests/msa_server_app.py DATABASE_DIR WORK_DIR [--lifetime SECONDS]

It listens on 127.0.0.1 (a free port, printed as `PORT <n>` once ready), runs one ticket at a
time in a worker thread, and stops by itself after --lifetime seconds or when its parent exits.

Tests steer it through POST /control (form fields, each optional):
  ratelimit=N      the next N submissions answer {"status": "RATELIMIT"}
  fail=C1,C2,...   the next requests answer these HTTP status codes, one each, in order
  error=N          the next N tickets end with status ERROR
  stuck=1|0        tickets report RUNNING (whatever their state) until stuck=0
  stall=1|0        status requests get no answer until stall=0 (a server that hangs)
  malformed=N      the next N downloads are not a tar.gz
  drop=N           the next N downloads lack their last query's A3M
  forget=1         forget every ticket (as after a server restart)
  reset=1          all of the above off, counters to zero
and GET /stats returns the counters: submitted, ratelimited, failed, downloads.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import queue
import sys
import tarfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

from foldmill.msa import colabfold

UNPAIRED_MODES = {"env": (True, True), "all": (False, True), "env-nofilter": (True, False), "nofilter": (False, False)}
# Pairing modes -> (pairaln --pairing-mode, pair environmental hits too). The -env modes pair the
# hits of the environmental pairing database as well (colabfold_search --use-env-pairing 1 and its
# --db4, SPIRE, laid out as spire_*_db with its taxonomy mapping) and append each chain's paired
# A3M from it after its UniRef30 one, as colabfold_search does; a database directory without such a
# database answers them with status ERROR.
PAIRED_MODES = {"pairgreedy": (0, False), "paircomplete": (1, False), "pairgreedy-env": (0, True),
                "paircomplete-env": (1, True)}  # fmt: skip
ENVIRONMENTAL_PAIRING_GLOB = "spire_*_db"
AMINO_ACIDS = set("ACDEFGHIKLMNPQRSTVWYXBZUO")


class Ticket:
    def __init__(self, kind: str, mode: str, sequences: list[str]) -> None:
        self.id = uuid.uuid4().hex
        self.kind, self.mode, self.sequences = kind, mode, sequences
        self.status = "PENDING"
        self.result = b""


class State:
    """Tickets and the failure switches, shared by the request threads and the worker."""

    def __init__(self, databases: colabfold.ColabFoldDatabases, workdir: Path) -> None:
        self.databases, self.workdir = databases, workdir
        self.lock = threading.Lock()
        self.tickets: dict[str, Ticket] = {}
        self.work: queue.Queue[Ticket] = queue.Queue()
        self.results: dict[tuple[str, ...], bytes] = {}  # an identical request is searched once
        self.answering = threading.Event()  # cleared while status requests stall
        self.reset()

    def reset(self) -> None:
        self.ratelimit = self.error = self.malformed = self.drop = 0
        self.fail: list[int] = []
        self.stuck = False
        self.answering.set()
        self.counters = {"submitted": 0, "ratelimited": 0, "failed": 0, "downloads": 0}

    def take(self, switch: str) -> bool:
        """Whether a countdown switch is on; counts it down."""
        with self.lock:
            if getattr(self, switch) > 0:
                setattr(self, switch, getattr(self, switch) - 1)
                return True
            return False


def parse_fasta(text: str) -> list[str]:
    sequences: list[str] = []
    for line in text.splitlines():
        if line.startswith(">"):
            sequences.append("")
        elif sequences:
            sequences[-1] += line.strip()
    return sequences


def search(state: State, ticket: Ticket) -> bytes:
    """Search the ticket's queries with ColabFold's protocol; pack the result as the server does."""
    workdir = state.workdir / ticket.id
    if ticket.kind == "msa":
        use_environmental, filtered = UNPAIRED_MODES[ticket.mode]
        settings = colabfold.ColabFoldSettings(threads=2, use_environmental=use_environmental, filter=filtered)
        colabfold.unpaired_msas(ticket.sequences, state.databases, workdir, settings)
        # the per-database A3M databases the protocol wrote before merging them
        parts = {"uniref.a3m": workdir / ("uniref.a3m" if use_environmental else "final.a3m")}
        if use_environmental:
            parts["bfd.mgnify30.metaeuk30.smag30.a3m"] = workdir / "env.a3m"
        files = {name: number_queries(colabfold.read_database(path), ticket.sequences) for name, path in parts.items()}
    else:
        strategy, environmental = PAIRED_MODES[ticket.mode]
        settings = colabfold.ColabFoldSettings(threads=2, pairing_strategy=strategy)
        chains = colabfold.paired_msas([ticket.sequences], state.databases, workdir / "uniref", settings)[0]
        if environmental:
            more = colabfold.paired_msas([ticket.sequences], environmental_pairing(state.databases.root),
                                         workdir / "environmental", settings)[0]  # fmt: skip
            chains = [uniref + extra for uniref, extra in zip(chains, more)]
        files = {"pair.a3m": "".join(f"{a3m}\0" for a3m in chains)}
    return pack(files)


def environmental_pairing(root: Path) -> colabfold.ColabFoldDatabases:
    """The environmental pairing database of a database directory, searched as the pairing searches
    UniRef30 (it takes UniRef30's place)."""
    names = sorted(path.name[: -len(".dbtype")] for path in root.glob(f"{ENVIRONMENTAL_PAIRING_GLOB}.dbtype"))
    if not names:
        raise ValueError(f"{root}: no environmental pairing database ({ENVIRONMENTAL_PAIRING_GLOB})")
    databases = colabfold.ColabFoldDatabases(root, names[0], None)
    databases.check(names[0])
    return databases


def drop_last_query(result: bytes) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(result), mode="r:gz") as archive:
        files = {member.name: archive.extractfile(member).read().decode() for member in archive.getmembers()}
    return pack({name: "\0".join(text.split("\0")[:-2]) + "\0" for name, text in files.items()})


def number_queries(entries: dict[int, str], sequences: list[str]) -> str:
    """One entry per query, NUL-terminated, its query row named by its place in the ticket (>101, ...)."""
    text = []
    for key, sequence in enumerate(sequences):
        _, _, rest = entries.get(key, f">101\n{sequence}\n").partition("\n")
        text.append(f">{101 + key}\n{rest}\0")
    return "".join(text)


def pack(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), int(time.time())
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def worker(state: State) -> None:
    while True:
        ticket = state.work.get()
        ticket.status = "RUNNING"
        try:
            if state.take("error"):
                raise ValueError("ERROR requested by the test")
            request = (ticket.kind, ticket.mode, *ticket.sequences)
            if request not in state.results:
                state.results[request] = search(state, ticket)
            ticket.result = drop_last_query(state.results[request]) if state.take("drop") else state.results[request]
            ticket.status = "COMPLETE"
        except Exception as error:  # noqa: BLE001 - any failure is the ticket's ERROR status
            print(f"ticket {ticket.id}: {error}", file=sys.stderr, flush=True)
            ticket.status = "ERROR"


class Handler(BaseHTTPRequestHandler):
    state: State

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    def reply(self, body: bytes | dict, code: int = 200, kind: str = "application/json") -> None:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def injected_failure(self) -> bool:
        with self.state.lock:
            code = self.state.fail.pop(0) if self.state.fail else 0
            if code:
                self.state.counters["failed"] += 1
        if code:
            self.reply({"error": "injected"}, code)
        return bool(code)

    def form(self) -> dict[str, str]:
        length = int(self.headers.get("Content-Length") or 0)
        fields = parse_qs(self.rfile.read(length).decode(), keep_blank_values=True)
        return {key: values[-1] for key, values in fields.items()}

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        form = self.form()
        if self.path == "/control":
            self.control(form)
            return
        if self.injected_failure():
            return
        kind = {"/ticket/msa": "msa", "/ticket/pair": "pair"}.get(self.path)
        if kind is None:
            self.reply({"error": "not found"}, 404)
            return
        if self.state.take("ratelimit"):
            with self.state.lock:
                self.state.counters["ratelimited"] += 1
            self.reply({"status": "RATELIMIT"})
            return
        sequences = parse_fasta(form.get("q", ""))
        modes = UNPAIRED_MODES if kind == "msa" else PAIRED_MODES
        valid = sequences and all(set(s) <= AMINO_ACIDS for s in sequences) and form.get("mode") in modes
        if not valid:
            self.reply({"status": "ERROR"})
            return
        ticket = Ticket(kind, form["mode"], sequences)
        with self.state.lock:
            self.state.tickets[ticket.id] = ticket
            self.state.counters["submitted"] += 1
        self.state.work.put(ticket)
        self.reply({"id": ticket.id, "status": ticket.status})

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/stats":
            with self.state.lock:
                self.reply(dict(self.state.counters))
            return
        if self.injected_failure():
            return
        parts = self.path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "ticket":
            self.state.answering.wait(timeout=600)
            ticket = self.state.tickets.get(parts[1])
            status = "UNKNOWN" if ticket is None else "RUNNING" if self.state.stuck else ticket.status
            self.reply({"id": parts[1], "status": status})
        elif len(parts) == 3 and parts[:2] == ["result", "download"] and parts[2] in self.state.tickets:
            with self.state.lock:
                self.state.counters["downloads"] += 1
            ticket = self.state.tickets[parts[2]]
            body = b"<html>not a result</html>" if self.state.take("malformed") else ticket.result
            self.reply(body, kind="application/octet-stream")
        else:
            self.reply({"error": "not found"}, 404)

    def control(self, form: dict[str, str]) -> None:
        with self.state.lock:
            if form.get("reset"):
                self.state.reset()
            if form.get("forget"):
                self.state.tickets.clear()
            for switch in ("ratelimit", "error", "malformed", "drop"):
                if switch in form:
                    setattr(self.state, switch, int(form[switch]))
            if "fail" in form:
                self.state.fail = [int(code) for code in form["fail"].split(",") if code]
            if "stuck" in form:
                self.state.stuck = form["stuck"] == "1"
            if "stall" in form:
                (self.state.answering.clear if form["stall"] == "1" else self.state.answering.set)()
        self.reply({"ok": True})


def stop_when_orphaned_or_expired(server: ThreadingHTTPServer, parent: int, lifetime: float) -> None:
    deadline = time.monotonic() + lifetime
    while time.monotonic() < deadline and os.getppid() == parent:
        time.sleep(0.5)
    server.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", type=Path)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--lifetime", type=float, default=1800.0)
    arguments = parser.parse_args()
    state = State(colabfold.ColabFoldDatabases.find(arguments.database), arguments.workdir)
    Handler.state = state
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=worker, args=(state,), daemon=True).start()
    threading.Thread(
        target=stop_when_orphaned_or_expired, args=(server, os.getppid(), arguments.lifetime), daemon=True
    ).start()
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever(poll_interval=0.2)


if __name__ == "__main__":
    main()
