"""MSAs from a ColabFold MSA server (`msa.mode: server`): the API ColabFold's and Boltz's clients use.

The server searches ColabFold's databases with ColabFold's protocol, so a user without the 1 TB
of databases still gets the MSAs Boltz-2 was trained on. The API, as ColabFold's client calls it:

  POST {url}/ticket/msa   form q=FASTA (queries named >101, >102, ...), mode=env | all |
                          env-nofilter | nofilter                       -> {"id", "status"}
  POST {url}/ticket/pair  the chains of ONE complex, mode=pairgreedy | paircomplete, either with
                          -env to pair environmental hits as well
                                                                         -> {"id", "status"}
  GET  {url}/ticket/{id}                                                 -> {"id", "status"}
       status: PENDING | RUNNING | COMPLETE | ERROR | RATELIMIT | UNKNOWN | MAINTENANCE
  GET  {url}/result/download/{id}  a tar.gz with uniref.a3m and, for env modes,
       bfd.mgnify30.metaeuk30.smag30.a3m (unpaired), or pair.a3m (paired); each file holds one
       A3M per query, separated by NUL bytes, the query row named by its ticket number.

A query's unpaired A3M is its UniRef30 A3M followed by its environmental A3M (how ColabFold's
client merges the two files); its query header is renamed >101 whatever its place in the ticket
(>101, >102, ... per chain for paired A3Ms), which makes the result the same text the local
ColabFold-protocol search (foldmill.msa.colabfold) writes.

A proteome goes out in tickets of `batch_size` distinct sequences, one ticket per complex for
pairing, at most `concurrency` tickets at a time. Everything is cached under `cache_dir`, keyed by
server URL and mode: each result by sequence hash as soon as it is downloaded, and each ticket id
before it is polled, so a rerun (or a run after a crash) polls the tickets it already holds and
submits nothing that finished.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import queue
import random
import socket
import tarfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from foldmill import __version__
from foldmill.errors import FoldmillError
from foldmill.io.atomic import write_text_atomic

log = logging.getLogger(__name__)

PUBLIC_SERVER = "https://api.colabfold.com"
UNIREF_FILE = "uniref.a3m"
ENVIRONMENTAL_FILE = "bfd.mgnify30.metaeuk30.smag30.a3m"
PAIRED_FILE = "pair.a3m"
FIRST_QUERY = 101
WAITING = ("PENDING", "RUNNING", "UNKNOWN")
RETRY_LATER = ("RATELIMIT", "MAINTENANCE")
PAIRING_STRATEGIES = ("greedy", "complete")
FORGOTTEN_AFTER = 5  # consecutive UNKNOWN answers for a resumed ticket


CONFIG_KEYS = {  # msa.<key> in the workflow config -> ServerSettings field
    "server_url": "url",
    "server_environmental": "use_environmental",
    "server_filter": "filter",
    "server_pairing": "pairing_strategy",
    "server_pair_environmental": "pair_environmental",
    "server_concurrency": "concurrency",
    "server_batch_size": "batch_size",
    "server_max_wait": "max_wait",
    "server_retries": "retries",
    "server_user_agent": "user_agent",
}


class ServerError(FoldmillError):
    """A problem with the MSA server or one of its tickets (one line, naming the URL)."""


@dataclass(frozen=True)
class ServerSettings:
    url: str = PUBLIC_SERVER
    use_environmental: bool = True  # also search ColabFold's environmental databases (mode env)
    filter: bool = True  # ColabFold's diversity/coverage filter (mode env / all)
    pairing_strategy: str = "greedy"  # pairgreedy: best hit per species; paircomplete: only complete rows
    # pair environmental hits too (mode pair...-env), as `boltz predict --use_msa_server` asks;
    # colabfold_batch and colabfold_search pair UniRef30 hits only by default
    pair_environmental: bool = True
    concurrency: int = 2  # tickets in flight at once
    batch_size: int = 20  # distinct sequences per unpaired ticket
    poll_interval: float = 5.0  # seconds between status checks (plus up to as much again of jitter)
    max_wait: float = 4 * 3600.0  # seconds one ticket may stay queued/running before the run gives up
    retries: int = 8  # attempts per request on rate limits, 429/5xx and unreachable servers
    backoff: float = 5.0  # first backoff in seconds, doubled per attempt
    backoff_cap: float = 120.0
    timeout: float = 60.0  # seconds per HTTP request
    user_agent: str = f"foldmill/{__version__}"

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise FoldmillError(f"msa.server_url must be an http(s) URL, not {self.url!r}")
        if self.pairing_strategy not in PAIRING_STRATEGIES:
            raise FoldmillError(
                f"msa.server_pairing must be one of {', '.join(PAIRING_STRATEGIES)}, not {self.pairing_strategy!r}"
            )
        if min(self.concurrency, self.batch_size, self.retries) < 1:
            raise FoldmillError("msa.server_concurrency, msa.server_batch_size and msa.server_retries must be >= 1")

    @classmethod
    def from_config(cls, section: Mapping[str, object]) -> ServerSettings:
        """From the workflow's `msa:` config section: its msa.server_* keys (CONFIG_KEYS), defaults above."""
        values = {name: _config_value(key, section[key], type(getattr(cls, name)))
                  for key, name in CONFIG_KEYS.items() if key in section}  # fmt: skip
        return cls(**values)

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/")

    def unpaired_mode(self) -> str:
        if self.filter:
            return "env" if self.use_environmental else "all"
        return "env-nofilter" if self.use_environmental else "nofilter"

    def paired_mode(self) -> str:
        return f"pair{self.pairing_strategy}" + ("-env" if self.pair_environmental else "")

    def describe(self) -> str:
        """Everything that changes the MSAs (concurrency, batching and timing do not)."""
        return f"server:{self.base_url},{self.unpaired_mode()},{self.paired_mode()}"


def _config_value(key: str, value: object, kind: type) -> object:
    expected = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[kind]
    if kind is bool and isinstance(value, bool) or kind is str and isinstance(value, str):
        return value
    if kind in (int, float) and not isinstance(value, bool):
        try:
            return kind(value)
        except (TypeError, ValueError):
            pass
    raise FoldmillError(f"msa.{key} must be {expected}, not {value!r}")


def search(
    sequences: Mapping[str, str],
    complexes: Mapping[str, Sequence[str]],
    cache_dir: str | Path,
    settings: ServerSettings,
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Unpaired A3M per sequence id and paired A3Ms per complex id (one per distinct chain), as
    foldmill.msa.colabfold.search returns them; raises the first problem as one line after every
    other ticket has finished and been cached."""
    unpaired, paired, problems = search_each(sequences, complexes, cache_dir, settings)
    if problems:
        first = next(iter(problems.values()))
        count = f" ({len(problems)} sequence and complex ids without an MSA)" if len(problems) > 1 else ""
        raise ServerError(first + count)
    return unpaired, paired


def search_each(
    sequences: Mapping[str, str],
    complexes: Mapping[str, Sequence[str]],
    cache_dir: str | Path,
    settings: ServerSettings,
) -> tuple[dict[str, str], dict[str, list[str]], dict[str, str]]:
    """Like `search`, but a failing ticket costs only its own queries: returns (unpaired, paired,
    problems), problems naming each sequence or complex id without an MSA and why, in one line."""
    cache = ServerCache(Path(cache_dir), settings)
    client = Client(settings)

    by_sequence: dict[str, list[str]] = {}
    for name, sequence in sequences.items():
        by_sequence.setdefault(sequence, []).append(name)
    groups = {name: list(dict.fromkeys(chains)) for name, chains in complexes.items()}
    groups = {name: chains for name, chains in groups.items() if len(chains) > 1}  # homomers need no pairing

    missing = [sequence for sequence in by_sequence if cache.unpaired(sequence) is None]
    missing_groups = list(dict.fromkeys(tuple(chains) for chains in groups.values() if cache.paired(chains) is None))
    size = settings.batch_size
    jobs = [("msa", tuple(missing[start : start + size])) for start in range(0, len(missing), size)]
    jobs += [("pair", chains) for chains in missing_groups]
    cached = len(by_sequence) - len(missing) + len(groups) - len(missing_groups)
    log.info(
        "MSA server %s: %d tickets for %d sequences and %d complexes (%d found in the cache)",
        settings.base_url, len(jobs), len(missing), len(missing_groups), cached,
    )  # fmt: skip
    failures = _run_tickets(client, cache, jobs)
    # A ticket the server refused (status ERROR) may hold one bad sequence: its others go out alone.
    refused = [key for key, error in failures.items() if isinstance(error, TicketFailed) and len(key[1]) > 1]
    if refused:
        retry = [("msa", (sequence,)) for kind, batch in refused if kind == "msa" for sequence in batch]
        failures.update(_run_tickets(client, cache, retry))
    failed_sequences = {sequence: str(error) for (kind, batch), error in failures.items() if kind == "msa"
                        for sequence in batch}  # fmt: skip

    unpaired: dict[str, str] = {}
    paired: dict[str, list[str]] = {}
    problems: dict[str, str] = {}
    for sequence, names in by_sequence.items():
        a3m = cache.unpaired(sequence)
        for name in names:
            if a3m is not None:
                unpaired[name] = a3m
            else:
                problems[name] = failed_sequences.get(sequence, f"{settings.base_url}: no MSA for {name}")
    for name, chains in groups.items():
        a3ms = cache.paired(chains)
        if a3ms is not None:
            paired[name] = a3ms
        else:
            error = failures.get(("pair", tuple(chains)))
            problems[name] = str(error) if error else f"{settings.base_url}: no paired MSA for {name}"
    return unpaired, paired, problems


def _run_tickets(
    client: Client, cache: ServerCache, jobs: list[tuple[str, tuple[str, ...]]]
) -> dict[tuple[str, tuple[str, ...]], FoldmillError]:
    """Run each job ("msa" or "pair", its queries) as one ticket, `concurrency` at a time; the
    failed ones' errors by (kind, queries). An interrupt stops the run at once, even while a request
    waits on a stalled server: the tickets run on daemon threads that nothing waits for once the
    run stops, and the saved tickets are polled again by the next run. (A thread pool would hold the
    process until every request in flight returned: up to `timeout` seconds.)"""
    waiting: queue.SimpleQueue[tuple[str, tuple[str, ...]]] = queue.SimpleQueue()
    for job in jobs:
        waiting.put(job)
    done: queue.SimpleQueue[tuple[tuple[str, tuple[str, ...]], BaseException | None]] = queue.SimpleQueue()

    def work() -> None:
        while not client.stop.is_set():
            try:
                kind, queries = waiting.get_nowait()
            except queue.Empty:
                return
            try:
                TICKETS[kind](client, cache, list(queries))
                done.put(((kind, queries), None))
            except BaseException as error:  # noqa: BLE001 - handed to the calling thread, which decides
                done.put(((kind, queries), error))

    for number in range(min(client.settings.concurrency, len(jobs))):
        threading.Thread(target=work, name=f"msa-server-{number}", daemon=True).start()
    outcomes: dict[tuple[str, tuple[str, ...]], BaseException | None] = {}
    remaining = len(jobs)
    try:
        while remaining:
            try:
                # Timed, so that an interrupt the OS handed to a worker thread is still seen here.
                key, error = done.get(timeout=0.5)
            except queue.Empty:
                continue
            if error is not None and not isinstance(error, FoldmillError):
                raise error
            outcomes[key] = error
            remaining -= 1
    except BaseException:
        client.stop.set()
        raise
    return {job: outcomes[job] for job in jobs if outcomes[job] is not None}


def _unpaired_ticket(client: Client, cache: ServerCache, batch: list[str]) -> None:
    files = client.run_ticket("ticket/msa", client.settings.unpaired_mode(), batch, cache)
    names = [UNIREF_FILE] + ([ENVIRONMENTAL_FILE] if client.settings.use_environmental else [])
    parts = [client.read_queries(files, name, len(batch)) for name in names]
    for position, sequence in enumerate(batch):
        cache.store_unpaired(sequence, "".join(_as_query(part[position], FIRST_QUERY) for part in parts))


def _paired_ticket(client: Client, cache: ServerCache, chains: list[str]) -> None:
    files = client.run_ticket("ticket/pair", client.settings.paired_mode(), chains, cache)
    part = client.read_queries(files, PAIRED_FILE, len(chains))
    cache.store_paired(chains, [_as_query(a3m, FIRST_QUERY + position) for position, a3m in enumerate(part)])


TICKETS = {"msa": _unpaired_ticket, "pair": _paired_ticket}


def _as_query(a3m: str, number: int) -> str:
    """The A3M with its query row (first header) named `number`."""
    _, _, rest = a3m.partition("\n")
    return f">{number}\n{rest}"


def sequence_hash(sequence: str) -> str:
    return hashlib.sha256(sequence.encode()).hexdigest()


class ServerCache:
    """Results and open tickets of one server under <cache_dir>/colabfold-server-<URL digest>/.

    msa-<mode>/<h[:2]>/<h>.a3m      a sequence's unpaired A3M (h = its SHA-256), per unpaired mode
    <pair mode>/<h[:2]>/<h>.json    a complex's paired A3Ms, one per distinct chain in order
    tickets/<h>.json                a submitted ticket not yet downloaded (h = hash of its request)
    """

    def __init__(self, cache_dir: Path, settings: ServerSettings) -> None:
        digest = hashlib.sha256(settings.base_url.encode()).hexdigest()[:12]
        self.root = cache_dir / f"colabfold-server-{digest}"
        self.unpaired_dir = self.root / f"msa-{settings.unpaired_mode()}"
        self.paired_dir = self.root / settings.paired_mode()

    def _unpaired_path(self, sequence: str) -> Path:
        key = sequence_hash(sequence)
        return self.unpaired_dir / key[:2] / f"{key}.a3m"

    def _paired_path(self, chains: Sequence[str]) -> Path:
        key = sequence_hash("\n".join(chains))
        return self.paired_dir / key[:2] / f"{key}.json"

    def unpaired(self, sequence: str) -> str | None:
        path = self._unpaired_path(sequence)
        return path.read_text() if path.is_file() else None

    def paired(self, chains: Sequence[str]) -> list[str] | None:
        path = self._paired_path(chains)
        return json.loads(path.read_text()) if path.is_file() else None

    def store_unpaired(self, sequence: str, a3m: str) -> None:
        write_text_atomic(self._unpaired_path(sequence), a3m)

    def store_paired(self, chains: Sequence[str], a3ms: list[str]) -> None:
        write_text_atomic(self._paired_path(chains), json.dumps(a3ms))

    def ticket_path(self, endpoint: str, mode: str, queries: Sequence[str]) -> Path:
        key = sequence_hash("\n".join([endpoint, mode, *queries]))
        return self.root / "tickets" / f"{key}.json"


class Client:
    """HTTP calls of the ColabFold MSA server API, with retries and backoff (standard library only)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.stop = threading.Event()  # set on an interrupt: every waiting ticket gives up

    def sleep(self, seconds: float) -> None:
        if self.stop.wait(seconds):
            raise ServerError(f"{self.settings.base_url}: interrupted")

    def run_ticket(self, endpoint: str, mode: str, queries: list[str], cache: ServerCache) -> dict[str, bytes]:
        """Submit (or resume) one ticket, wait for it, download it: the result's files by name."""
        ticket_file = cache.ticket_path(endpoint, mode, queries)
        ticket_id = _saved_ticket(ticket_file)
        try:
            if ticket_id is not None:
                log.info("MSA server %s: resuming ticket %s", self.settings.base_url, ticket_id)
                try:
                    self.wait(ticket_id, resumed=True)
                except TicketLost as lost:
                    log.warning("%s; submitting it again", lost)
                    ticket_id = None
            if ticket_id is None:
                ticket_id = self.submit(endpoint, mode, queries)
                write_text_atomic(ticket_file, json.dumps({"id": ticket_id, "endpoint": endpoint, "mode": mode}))
                self.wait(ticket_id)
        except TicketFailed:
            ticket_file.unlink(missing_ok=True)  # a failed ticket is submitted again by the next run
            raise
        files = self.download(ticket_id)
        ticket_file.unlink(missing_ok=True)
        return files

    def submit(self, endpoint: str, mode: str, queries: list[str]) -> str:
        fasta = "".join(f">{FIRST_QUERY + position}\n{sequence}\n" for position, sequence in enumerate(queries))
        form = urllib.parse.urlencode({"q": fasta, "mode": mode}).encode()
        for attempt in range(self.settings.retries):
            reply = self.json_request(endpoint, form)
            status = reply.get("status")
            if status in RETRY_LATER:
                if attempt + 1 < self.settings.retries:
                    self.backoff(attempt, f"{self.settings.base_url}/{endpoint} answered {status}")
                continue
            if status == "ERROR":
                raise TicketFailed(f"{self.settings.base_url}: {endpoint} refused the query (status ERROR)")
            ticket_id = reply.get("id")
            if not isinstance(ticket_id, str) or not ticket_id or status not in (*WAITING, "COMPLETE"):
                raise ServerError(f"{self.settings.base_url}/{endpoint}: unexpected reply {_short(reply)}")
            log.info("MSA server %s: ticket %s for %d sequences (%s)", self.settings.base_url, ticket_id,
                     len(queries), mode)  # fmt: skip
            return ticket_id
        raise ServerError(f"{self.settings.base_url}: still {status} after {self.settings.retries} attempts")

    def wait(self, ticket_id: str, resumed: bool = False) -> None:
        """Poll until COMPLETE. A ticket of an earlier run that the server keeps calling UNKNOWN was
        forgotten (a server restart, an expired result): TicketLost."""
        started = time.monotonic()
        unknown = 0
        while True:
            status = self.json_request(f"ticket/{ticket_id}").get("status")
            if status == "COMPLETE":
                return
            unknown = unknown + 1 if status == "UNKNOWN" else 0
            if resumed and unknown >= FORGOTTEN_AFTER:
                raise TicketLost(f"{self.settings.base_url}: the server no longer knows ticket {ticket_id}")
            if status == "ERROR":
                raise TicketFailed(f"{self.settings.base_url}: ticket {ticket_id} failed on the server (status ERROR)")
            if status not in (*WAITING, *RETRY_LATER):
                raise ServerError(f"{self.settings.base_url}: ticket {ticket_id} has unknown status {status!r}")
            waited = time.monotonic() - started
            if waited >= self.settings.max_wait:
                raise ServerError(
                    f"{self.settings.base_url}: ticket {ticket_id} still {status} after {waited:.0f} s "
                    "(rerun to keep waiting for the same ticket)"
                )
            interval = self.settings.poll_interval
            self.sleep(interval + random.uniform(0, interval))

    def download(self, ticket_id: str) -> dict[str, bytes]:
        data = self.request(f"result/download/{ticket_id}")
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
                return {
                    Path(member.name).name: archive.extractfile(member).read()  # type: ignore[union-attr]
                    for member in archive.getmembers()
                    if member.isfile() and member.name.endswith(".a3m")
                }
        except (tarfile.TarError, OSError, EOFError) as error:
            url = self.settings.base_url
            raise ServerError(f"{url}: result of ticket {ticket_id} is not a tar.gz: {error}") from None

    def read_queries(self, files: dict[str, bytes], name: str, count: int) -> list[str]:
        """The A3M of queries 101 .. 100+count of one result file, in order; a missing one is an error."""
        if name not in files:
            found = ", ".join(sorted(files)) or "nothing"
            raise ServerError(f"{self.settings.base_url}: result has no {name} (it has {found})")
        entries: dict[int, str] = {}
        for entry in files[name].decode("utf-8", errors="replace").split("\0"):
            if not entry.strip():
                continue
            header, _, _ = entry.lstrip("\n").partition("\n")
            try:
                number = int(header[1:].strip()) if header.startswith(">") else -1
            except ValueError:
                number = -1
            if number < FIRST_QUERY:
                raise ServerError(f"{self.settings.base_url}: {name}: malformed entry starting {header[:40]!r}")
            entries[number] = entries.get(number, "") + entry.lstrip("\n")
        absent = [FIRST_QUERY + position for position in range(count) if FIRST_QUERY + position not in entries]
        if absent:
            raise ServerError(f"{self.settings.base_url}: {name} lacks the MSA of query >{absent[0]}")
        return [entries[FIRST_QUERY + position] for position in range(count)]

    def json_request(self, path: str, form: bytes | None = None) -> dict:
        body = self.request(path, form)
        try:
            reply = json.loads(body)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise ServerError(f"{self.settings.base_url}/{path}: reply is not a JSON object: {_short(body)}")
        return reply

    def request(self, path: str, form: bytes | None = None) -> bytes:
        """One request, retried with backoff on 429, 5xx, timeouts and refused connections."""
        url = f"{self.settings.base_url}/{path}"
        problem = ""
        for attempt in range(self.settings.retries):
            request = urllib.request.Request(url, data=form, headers={"User-Agent": self.settings.user_agent})
            try:
                with urllib.request.urlopen(request, timeout=self.settings.timeout) as response:
                    return response.read()
            except urllib.error.HTTPError as error:
                if error.code != 429 and error.code < 500:
                    raise ServerError(f"{url}: HTTP {error.code} {error.reason}") from None
                problem = f"HTTP {error.code} {error.reason}"
            except (urllib.error.URLError, socket.timeout, ConnectionError) as error:
                reason = getattr(error, "reason", error)
                problem = f"unreachable ({reason})"
            if attempt + 1 < self.settings.retries:
                self.backoff(attempt, f"{url}: {problem}")
        raise ServerError(f"{url}: MSA server {problem} after {self.settings.retries} attempts")

    def backoff(self, attempt: int, reason: str) -> None:
        delay = min(self.settings.backoff_cap, self.settings.backoff * 2**attempt)
        delay *= 1 + random.uniform(0, 0.5)
        log.warning("%s; retrying in %.1f s", reason, delay)
        self.sleep(delay)


class TicketFailed(ServerError):
    """The server ran the ticket and reported ERROR: resubmitting the same request is pointless now."""


class TicketLost(ServerError):
    """The server does not know a ticket saved by an earlier run."""


def _saved_ticket(path: Path) -> str | None:
    """The ticket id an earlier run saved before polling; None if there is none (or it is unreadable)."""
    try:
        ticket_id = json.loads(path.read_text()).get("id")
    except (OSError, ValueError, AttributeError):
        return None
    return ticket_id if isinstance(ticket_id, str) and ticket_id else None


def _short(value: object) -> str:
    text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
    text = " ".join(text.split())
    return text[:120] + ("..." if len(text) > 120 else "")
