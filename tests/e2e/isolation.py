"""What the request-isolation tests (issue 28) share: a continuous-mode torchserve serving the
tiny model on the hf backend, the routes, bodies written as raw JSON text, a bystander stream,
and the checks that a hostile request hurt nobody.

The contract: whatever bytes arrive, the answer is a 200 (a well-formed body or stream) or a
4xx with the route's JSON error body; the worker process is the same one afterwards (its pid);
every slot is free once the requests are answered (the `llm_slots_occupied` and
`llm_requests_waiting` gauges on the Prometheus port); and a normal stream served meanwhile
gets all its tokens without a long pause.

Bodies go out as bytes (`httpx` `content=`) with Content-Type application/json: `raw_json`
writes the JSON text `"\\ud800"` for a lone surrogate in a Python string, which a client's
JSON encoder refuses to send, and puts `Raw` fragments (`1e999999`, 100,000 nested arrays) in
verbatim.
"""

from __future__ import annotations

import copy
import itertools
import json
import secrets
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import httpx

from handler.serving.ts_compat import TORCHSERVE_VERSION
from scripts.bench.soak import GAUGES, gauges
from tests.support.torchserve_process import TorchServe

N_SLOTS = 4
BYSTANDER_TOKENS = 200
BYSTANDER_GAP_S = 1.5  # generous: the tiny model's decode step is a few ms; not a timing benchmark
SLOTS_FREE_WITHIN_S = 10.0
CLIENT_TIMEOUT_S = 60.0
LOCAL_HOST = "127.0.0.1"  # every request of these tests goes here and nowhere else


# -- routes ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Route:
    name: str
    path: str  # after /predictions/<model>
    api: Literal["native", "openai", "tgi"]

    def url(self, server: TorchServe) -> str:
        return server.predictions_url + self.path

    @property
    def refusal_status(self) -> int:
        """The status of a request the route refuses as invalid: TGI's 422, else 400."""
        return 422 if self.api == "tgi" else 400


NATIVE = Route("native", "", "native")
COMPLETIONS = Route("completions", "/1.0/v1/completions", "openai")
CHAT = Route("chat", "/1.0/v1/chat/completions", "openai")
GENERATE = Route("generate", "/1.0/generate", "tgi")
GENERATE_STREAM = Route("generate_stream", "/1.0/generate_stream", "tgi")
# TorchServe 0.11 passes no path to the handler: its /generate routes are served as the native
# route (the body decides; docs/tgi.md), so the TGI wire format is probed on 0.12 only.
TGI_ROUTES = (GENERATE, GENERATE_STREAM) if TORCHSERVE_VERSION >= (0, 12) else ()
ROUTES = (NATIVE, COMPLETIONS, CHAT, *TGI_ROUTES)

# A small valid body per route: its 200 takes a few decode steps.
BASE_BODIES: dict[str, dict[str, Any]] = {
    "native": {"prompt": "Hello", "max_new_tokens": 4},
    "completions": {"model": "llama", "prompt": "Hello", "max_tokens": 4},
    "chat": {"model": "llama", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4},
    "generate": {"inputs": "Hello", "parameters": {"max_new_tokens": 4}},
    "generate_stream": {"inputs": "Hello", "parameters": {"max_new_tokens": 4}},
}


def base_body(route: Route, **fields: Any) -> dict[str, Any]:
    """The route's small valid body with `fields` set (TGI: into `parameters`, except `inputs` and `stream`)."""
    body = copy.deepcopy(BASE_BODIES[route.name])
    for key, value in fields.items():
        if route.api == "tgi" and key not in ("inputs", "stream"):
            body["parameters"][key] = value
        else:
            body[key] = value
    return body


# -- raw JSON ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Raw:
    """JSON text that goes into a body verbatim: what no Python value serializes to."""

    text: str


def nested_arrays(depth: int, inner: str = "") -> Raw:
    return Raw("[" * depth + inner + "]" * depth)


def nested_objects(depth: int, key: str = "a") -> Raw:
    return Raw(f'{{"{key}": ' * depth + "1" + "}" * depth)


def raw_json(value: Any) -> bytes:
    """`value` as ASCII JSON bytes: a lone surrogate becomes `\\udxxx` (what httpx's `json=`
    cannot send), NaN and the infinities JSON's non-standard literals, a `Raw` its own text."""
    marker = secrets.token_hex(8)
    fragments: list[str] = []

    def swap(node: Any) -> Any:
        if isinstance(node, Raw):
            fragments.append(node.text)
            return f"raw-{marker}-{len(fragments) - 1}"
        if isinstance(node, dict):
            return {key: swap(item) for key, item in node.items()}
        if isinstance(node, (list, tuple)):
            return [swap(item) for item in node]
        return node

    text = json.dumps(swap(value))  # ensure_ascii (the default) escapes lone surrogates
    for i, fragment in enumerate(fragments):
        text = text.replace(json.dumps(f"raw-{marker}-{i}"), fragment, 1)
    return text.encode("ascii")


# -- answers -----------------------------------------------------------------------------
@dataclass
class Answer:
    status: int = 0  # 0: no HTTP answer at all
    content_type: str = ""
    text: str = ""
    seconds: float = 0.0
    transport_error: str | None = None

    def short(self, limit: int = 300) -> str:
        if self.transport_error:
            return f"no answer ({self.transport_error})"
        text = self.text if len(self.text) <= limit else self.text[:limit] + "…"
        return f"{self.status} {self.content_type or '-'} {text!r}"


def local_client() -> httpx.Client:
    """A client that ignores proxy settings from the environment: every request stays on this host."""
    return httpx.Client(timeout=CLIENT_TIMEOUT_S, trust_env=False)


def send(client: httpx.Client, server: TorchServe, route: Route, body: bytes) -> Answer:
    """POST `body` as it is, as application/json; never raises for what the server does."""
    url = route.url(server)
    if httpx.URL(url).host != LOCAL_HOST:
        raise AssertionError(f"refusing to send a request to {url}: only {LOCAL_HOST} is allowed")
    headers = {**server.headers, "Content-Type": "application/json"}
    started = time.perf_counter()
    try:
        response = client.post(url, content=body, headers=headers)
    except httpx.TransportError as exc:
        return Answer(seconds=time.perf_counter() - started, transport_error=f"{type(exc).__name__}: {exc}")
    return Answer(
        response.status_code,
        response.headers.get("content-type", ""),
        response.content.decode("utf-8", errors="replace"),
        time.perf_counter() - started,
    )


def streamed_events(content_type: str, text: str) -> list[dict[str, Any]]:
    """The objects of a streamed body, strictly: every NDJSON line, every SSE `data:` event
    (but `[DONE]`) must be one whole JSON object. Raises ValueError on anything else."""
    events: list[dict[str, Any]] = []
    if content_type.startswith("application/x-ndjson"):
        if text and not text.endswith("\n"):
            raise ValueError(f"the last line is cut: {text[-120:]!r}")
        chunks = [line for line in text.split("\n") if line.strip()]
    elif content_type.startswith("text/event-stream"):
        chunks = []
        for event in text.split("\n\n"):
            if not event.strip():
                continue
            if not event.startswith("data:"):
                raise ValueError(f"an SSE event without data: {event[:120]!r}")
            payload = event[len("data:") :].strip()
            if payload != "[DONE]":
                chunks.append(payload)
    else:
        raise ValueError(f"not a streamed content type: {content_type!r}")
    for chunk in chunks:
        obj = json.loads(chunk)
        if not isinstance(obj, dict):
            raise ValueError(f"a streamed event that is not a JSON object: {chunk[:120]!r}")
        events.append(obj)
    return events


def _finished(route: Route, events: list[dict[str, Any]]) -> bool:
    """The stream ended the way a complete response ends on this route."""
    if not events:
        return False
    last = events[-1]
    if route.api == "tgi":
        return isinstance(last.get("generated_text"), str)
    if any("choices" in e for e in events):  # OpenAI (the native route answers OpenAI-shaped bodies so)
        return any(c.get("finish_reason") for e in events for c in e.get("choices") or [])
    return bool(last.get("finish_reason"))


def error_shape_problem(route: Route, body: Any) -> str | None:
    """Why `body` is not the route's JSON error (TGI `{"error": str, "error_type": str}`, OpenAI and
    native `{"error": {"message", "param", "type"}}`), nor TorchServe's own (`{"code", "type", "message"}`)."""
    if isinstance(body, dict) and isinstance(body.get("code"), int) and isinstance(body.get("message"), str):
        return None  # the frontend's own refusal (413, 404, ...)
    if route.api == "tgi" and isinstance(body, dict) and isinstance(body.get("error"), str):
        return None if isinstance(body.get("error_type"), str) else "a TGI error without error_type"
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "not a JSON error object"
    if not isinstance(error.get("message"), str) or not isinstance(error.get("type"), str) or "param" not in error:
        return "an error without message, type and param"
    return None


def contract_problems(route: Route, answer: Answer) -> list[str]:
    """What breaks the general contract: a 200 must be well-formed (a streamed one ends with its
    finish, never an error), anything else must be a 4xx with a JSON error body that blames the
    request (TGI's 424 `generation` is its 500)."""
    if answer.transport_error:
        return [f"no HTTP answer: {answer.transport_error}"]
    if answer.status == 200:
        if answer.content_type.startswith(("application/x-ndjson", "text/event-stream")):
            try:
                events = streamed_events(answer.content_type, answer.text)
            except ValueError as exc:
                return [f"a malformed stream: {exc}"]
            errors = [e for e in events if "error" in e]
            if errors:
                return [f"a 200 stream that ended in an error: {errors[-1]}"]
            if not _finished(route, events):
                return ["a 200 stream that ended without its finish"]
            return []
        try:
            json.loads(answer.text)
        except ValueError:
            return ["a 200 whose body is not JSON"]
        return []
    if not 400 <= answer.status < 500:
        return [f"status {answer.status}, neither 200 nor a 4xx"]
    try:
        body = json.loads(answer.text)
    except ValueError:
        return [f"a {answer.status} whose body is not JSON"]
    problem = error_shape_problem(route, body)
    if problem:
        return [f"a {answer.status} body that is {problem}"]
    if _server_failure(body):
        return [f"a {answer.status} that says the server failed, not the request"]
    return []


def _server_failure(body: Any) -> bool:
    """A 4xx body that reports a server failure: TGI's 424 `generation` (what TGI answers where
    the others answer 500), or an error typed `server_error`."""
    if not isinstance(body, dict):
        return False
    error = body.get("error")
    return body.get("error_type") == "generation" or (isinstance(error, dict) and error.get("type") == "server_error")


def names_field(route: Route, answer: Answer, field_name: str) -> bool:
    """The error names `field_name`: OpenAI and native in `param` (the field, or a path inside
    it such as `stop.1` or `messages[0].content`), TGI (which has no param) in its message."""
    try:
        body = json.loads(answer.text)
    except ValueError:
        return False
    if route.api == "tgi":
        return isinstance(body, dict) and field_name in str(body.get("error", ""))
    error = body.get("error") if isinstance(body, dict) else None
    param = error.get("param") if isinstance(error, dict) else None
    return isinstance(param, str) and (param == field_name or param.startswith((field_name + ".", field_name + "[")))


# -- probes ------------------------------------------------------------------------------
Outcome = Literal["refused", "served", "any"]


@dataclass(frozen=True)
class Probe:
    """One request and what its answer must be: `refused` (the route's invalid-request status and
    error body, naming `field` when given), `served` (a well-formed 200), or `any` (the general
    contract); within `within_s` when given."""

    name: str
    route: Route
    body: bytes
    outcome: Outcome = "refused"
    field: str | None = None
    within_s: float | None = None

    def problems(self, answer: Answer) -> list[str]:
        found = contract_problems(self.route, answer)
        if self.outcome == "refused" and answer.status != self.route.refusal_status:
            found.append(f"expected {self.route.refusal_status}")
        elif self.outcome == "served" and answer.status != 200:
            found.append("expected 200")
        elif self.outcome == "refused" and self.field and not names_field(self.route, answer, self.field):
            found.append(f"the error does not name {self.field!r}")
        if self.within_s is not None and answer.seconds > self.within_s:
            found.append(f"answered after {answer.seconds:.2f} s, not within {self.within_s} s")
        return found


def probe(
    name: str,
    route: Route,
    body: Any,
    outcome: Outcome = "refused",
    field: str | None = None,
    within_s: float | None = None,
) -> Probe:
    """A probe whose body is `body` as raw JSON (bytes are sent as they are)."""
    data = body if isinstance(body, bytes) else raw_json(body)
    return Probe(f"{route.name}: {name}", route, data, outcome, field, within_s)


# -- the bystander -----------------------------------------------------------------------
@dataclass
class Stream:
    """One bystander completion as its client saw it."""

    status: int = 0
    arrivals: list[float] = field(default_factory=list)  # time.perf_counter() per received piece
    lines: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def problems(self) -> list[str]:
        if self.error:
            return [f"bystander: {self.error}"]
        if self.status != 200:
            return [f"bystander: status {self.status}"]
        last = self.lines[-1] if self.lines else {}
        if "error" in last:
            return [f"bystander: ended with an error line {last}"]
        tokens = (last.get("usage") or {}).get("completion_tokens")
        if last.get("finish_reason") != "length" or tokens != BYSTANDER_TOKENS:
            return [f"bystander: ended with {last} instead of all {BYSTANDER_TOKENS} tokens"]
        return []


class Bystander:
    """Normal streamed completions (native route, BYSTANDER_TOKENS tokens, ignore_eos) one after
    another on a thread of their own, from `start()` (which returns once the first chunk is in)
    until `stop()`: whatever the probes take, a stream is running all the while."""

    BODY: ClassVar[dict[str, Any]] = {
        "prompt": "Once upon a time",
        "max_new_tokens": BYSTANDER_TOKENS,
        "ignore_eos": True,
    }

    def __init__(self, server: TorchServe) -> None:
        self._server = server
        self._stopping = threading.Event()
        self._first = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bystander")
        self.streams: list[Stream] = []

    def start(self, timeout_s: float = 60.0) -> Bystander:
        self._thread.start()
        if not self._first.wait(timeout_s):
            raise AssertionError(f"the bystander got no first chunk in {timeout_s} s")
        return self

    def stop(self) -> list[Stream]:
        self._stopping.set()
        self._thread.join(CLIENT_TIMEOUT_S)
        assert not self._thread.is_alive(), "the bystander's stream did not end"
        return self.streams

    def _run(self) -> None:
        with local_client() as client:
            while True:
                stream = Stream()
                self.streams.append(stream)
                self._one(client, stream)
                self._first.set()
                if stream.problems() or self._stopping.is_set():
                    return

    def _one(self, client: httpx.Client, stream: Stream) -> None:
        url = self._server.predictions_url
        pending = b""
        try:
            with client.stream("POST", url, json=self.BODY, headers=self._server.headers) as response:
                stream.status = response.status_code
                for piece in response.iter_raw():
                    stream.arrivals.append(time.perf_counter())
                    self._first.set()
                    *complete, pending = (pending + piece).split(b"\n")
                    stream.lines += [json.loads(line) for line in complete if line.strip()]
        except (httpx.HTTPError, ValueError) as exc:
            stream.error = f"{type(exc).__name__}: {exc}"

    def largest_gap(self) -> float:
        """The longest the client went without a piece, from the first piece on (the next
        stream's wait for its first piece counts too)."""
        times = [t for stream in self.streams for t in stream.arrivals]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


# -- the worker --------------------------------------------------------------------------
def worker_pid(server: TorchServe, timeout_s: float = 30.0) -> int:
    """The pid of the one worker process (waits while a restarted one is coming up)."""
    deadline = time.monotonic() + timeout_s
    pids = server.worker_pids()
    while len(pids) != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
        pids = server.worker_pids()
    assert len(pids) == 1, f"expected one worker process, found {pids}"
    return pids[0]


def slots_left(server: TorchServe, timeout_s: float = SLOTS_FREE_WITHIN_S) -> dict[str, float]:
    """The slot gauges once both read 0, or as they read after `timeout_s` (then some slot is held)."""
    deadline = time.monotonic() + timeout_s
    while True:
        values = gauges(server.scrape_metrics())
        if all(values.get(name) == 0 for name in GAUGES) or time.monotonic() > deadline:
            return values
        time.sleep(0.25)


def slot_problems(server: TorchServe) -> list[str]:
    values = slots_left(server)
    if all(values.get(name) == 0 for name in GAUGES):
        return []
    return [f"slots not freed within {SLOTS_FREE_WITHIN_S} s: {values}"]


def wait_until_serving(server: TorchServe, timeout_s: float = 90.0) -> None:
    """Until a small request gets its 200 (a restarted worker has loaded)."""
    deadline = time.monotonic() + timeout_s
    with local_client() as client:
        while time.monotonic() < deadline:
            if send(client, server, NATIVE, raw_json({**BASE_BODIES["native"], "stream": False})).status == 200:
                return
            time.sleep(0.5)
    raise AssertionError(f"the server did not serve again within {timeout_s} s")


# -- one probe class beside a bystander --------------------------------------------------
@dataclass
class IsolationRun:
    answers: list[tuple[Probe, Answer]]
    streams: list[Stream]
    largest_gap_s: float
    pid_before: int
    pids_after: list[int]
    problems: list[str]

    def summary(self) -> str:
        lines = [
            f"{len(self.answers)} probes beside {len(self.streams)} bystander stream(s); "
            f"largest bystander gap {self.largest_gap_s * 1000:.0f} ms; worker {self.pid_before} -> {self.pids_after}"
        ]
        lines += [f"  {p.name}: {a.status} in {a.seconds * 1000:.0f} ms" for p, a in self.answers]
        return "\n".join(lines)


def run_beside_bystander(server: TorchServe, probes: Sequence[Probe]) -> IsolationRun:
    """Send the probes one by one while bystander streams run, then collect what went wrong:
    probes answered against their expectation, a bystander stream cut or short, a pause in the
    bystander's stream over BYSTANDER_GAP_S, another worker process, slots left occupied."""
    pid_before = worker_pid(server)
    bystander = Bystander(server).start()
    answers: list[tuple[Probe, Answer]] = []
    try:
        with local_client() as client:
            for p in probes:
                answers.append((p, send(client, server, p.route, p.body)))
    finally:
        streams = bystander.stop()
    problems = [f"{p.name}: {'; '.join(found)}: {a.short()}" for p, a in answers if (found := p.problems(a))]
    for i, stream in enumerate(streams):
        problems += [f"{issue} (stream {i + 1} of {len(streams)})" for issue in stream.problems()]
    gap = bystander.largest_gap()
    if gap > BYSTANDER_GAP_S:
        problems.append(f"bystander: a {gap:.2f} s pause between chunks (bound {BYSTANDER_GAP_S} s)")
    pids_after = server.worker_pids()
    if pids_after != [pid_before]:
        problems.append(f"the worker process changed: {pid_before} -> {pids_after}")
        wait_until_serving(server)  # so the next test starts on a serving worker
    problems += slot_problems(server)
    return IsolationRun(answers, streams, gap, pid_before, pids_after, problems)


def assert_isolated(server: TorchServe, probes: Iterable[Probe]) -> IsolationRun:
    run = run_beside_bystander(server, list(probes))
    print("\n" + run.summary())
    assert not run.problems, "\n".join(run.problems)
    return run
