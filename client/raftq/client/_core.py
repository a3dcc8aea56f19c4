"""The client's pure core: request building, response decoding, leader choice, retry decisions.

Nothing here does I/O or sleeps. ``AsyncClient`` and ``Client`` run the same loop around it:
``prepare`` a request, send it to ``Endpoints.pick()``, feed the answer to ``interpret``, and on an
error ask ``retry_delay`` whether (and after how long) to try again before the deadline.

A server that says when to come back (``Retry-After`` on a 429 ``topic_full`` or a 503
``overloaded``) is taken at its word: the next try waits that long (at most
``RETRY_AFTER_CAP``, with a little jitter so refused clients do not return together), or, when
that is past the caller's deadline, the error is raised at once. A 429 without it is not
retried. ``no_leader`` and ``shutting_down`` keep their own quicker rhythm: an election ends
within about one election timeout, and a stopping node is passed over for another.
"""

from __future__ import annotations

import base64
import email.utils
import itertools
import json
import random
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import msgpack

from raftq.client.errors import (
    ProtocolError,
    RaftqError,
    RaftqTimeout,
    StorageFull,
    TLSError,
    TopicFull,
    Unavailable,
    UnknownOutcome,
    error_from_body,
)

MSGPACK = "application/msgpack"
JSON = "application/json"
MAX_REDIRECTS = 3
BACKOFF_BASE = 0.05
BACKOFF_CAP = 1.0
# A live node said "no leader": an election is under way and ends within about one election
# timeout, so poll it often (a 1 s backoff made a 1.3 s election look like 2 s to publishers).
NO_LEADER_CAP = 0.15
RETRY_AFTER_CAP = 30.0  # the longest Retry-After honoured
RETRY_AFTER_JITTER = 0.1  # waits Retry-After x [1, 1.1]


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: Any = None
    # Safe to send again when the first try's outcome is unknown (reads; publishes with keys;
    # settles). Off unless the builder says so: a request nobody thought about is never resent.
    idempotent: bool = False
    # Seconds the server may legitimately hold the request (long poll), added to the timeout.
    hold: float = 0.0
    # ack / nack / extend / term: a retry of one that was applied finds its receipts stale.
    settle: bool = False
    # A 429 topic_full with Retry-After is tried again after it (False: raised at once; the
    # coalescer splits a refused batch, and each message then waits on its own).
    wait_full: bool = True


@dataclass(frozen=True)
class Wire:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes | None


def path(*parts: str) -> str:
    return "/" + "/".join(quote(p, safe="") for p in parts)


def prepare(req: Request, fmt: str = MSGPACK) -> Wire:
    headers = {"Accept": fmt}
    data: bytes | None = None
    if req.body is not None:
        if fmt == MSGPACK:
            data = msgpack.packb(req.body, use_bin_type=True)
        else:
            data = json.dumps(_b64_payloads(req.body)).encode()
        headers["Content-Type"] = fmt
    return Wire(req.method, req.path, headers, data)


# Headers the client (or the HTTP and WebSocket code under it) sets itself: an ``http_headers``
# hook may not give them, so it can never change how a request is framed or negotiated.
CLIENT_HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "connection",
        "content-encoding",
        "content-length",
        "content-type",
        "host",
        "te",
        "transfer-encoding",
        "upgrade",
    }
)  # and every "sec-websocket-*"
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")

HeadersHook = Mapping[str, str] | Callable[[], Mapping[str, str]]


def check_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers a hook gave, checked: HTTP tokens for names (each once, whatever its case),
    no control characters in values, none of ``CLIENT_HEADERS`` (``ValueError`` otherwise)."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    for name, value in headers.items():
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise ValueError(f"http_headers: not a header name: {name!r}")
        low = name.lower()
        if low in CLIENT_HEADERS or low.startswith("sec-websocket-"):
            raise ValueError(f"http_headers: {name} is the client's own header, not settable")
        if low in seen:
            raise ValueError(f"http_headers: {name} given twice")
        if not isinstance(value, str) or not _FIELD_VALUE.fullmatch(value):
            raise ValueError(f"http_headers: {name}: not a header value: {value!r}")
        seen.add(low)
        out[name] = value
    return out


def header_source(hook: HeadersHook | None) -> Callable[[], dict[str, str]] | None:
    """What a client calls for each request's extra headers: None without a hook; for a
    mapping (checked now), that mapping every time; for a callable, its answer to each call,
    checked each time."""
    if hook is None:
        return None
    if callable(hook):
        fn = hook
        return lambda: check_headers(fn())
    fixed = check_headers(hook)
    return lambda: fixed


TOKEN_ENV = "RAFTQ_TOKEN"


def with_token(
    token: str | None, hook: HeadersHook | None, from_env: bool = False
) -> HeadersHook | None:
    """``hook`` plus ``Authorization: Bearer <token>`` (no token: the hook alone). A hook that
    names Authorization too is refused, unless the token came from ``RAFTQ_TOKEN``
    (``from_env``): then the hook's own, being explicit, wins."""
    if not token:
        return hook
    bearer = {"Authorization": f"Bearer {token}"}
    check_headers(bearer)  # (a token with a newline in it would smuggle a header)
    if hook is None:
        return bearer

    def both(given: Mapping[str, str]) -> dict[str, str]:
        if any(k.lower() == "authorization" for k in given):
            if from_env:
                return dict(given)
            raise ValueError("http_headers: Authorization is set by token=; give one of them")
        return {**given, **bearer}

    if callable(hook):
        fn = hook
        return lambda: both(fn())
    return both(hook)


def with_headers(
    headers: dict[str, str], extra: Callable[[], dict[str, str]] | None
) -> dict[str, str]:
    """A request's headers plus the hook's (which cannot name any of the request's own)."""
    return headers if extra is None else {**headers, **extra()}


def _b64_payloads(obj: Any) -> Any:
    """JSON has no bytes: payloads travel as base64 strings."""
    if isinstance(obj, bytes):
        return base64.b64encode(obj).decode()
    if isinstance(obj, dict):
        return {k: _b64_payloads(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_b64_payloads(v) for v in obj]
    return obj


def decode(
    status: int, content_type: str | None, data: bytes, retry_after: str | None = None
) -> Any:
    """Decode a response body, or raise the error it carries (with the response's
    ``Retry-After`` header, parsed, as its ``retry_after``)."""
    ctype = (content_type or "").split(";")[0].strip()
    body: Any = None
    if data:
        try:
            if ctype == MSGPACK:
                body = msgpack.unpackb(data, raw=False, strict_map_key=False)
            elif ctype == JSON or data[:1] in (b"{", b"["):
                body = json.loads(data)
            else:
                body = data.decode("utf-8", "replace")
        except (ValueError, msgpack.UnpackException) as e:
            raise ProtocolError(
                f"undecodable {ctype or 'response'} body: {e}", status=status
            ) from e
    if status >= 400:
        err = error_from_body(status, body)
        err.retry_after = parse_retry_after(retry_after)
        raise err
    if ctype == JSON:
        body = _unb64_deliveries(body)
    return body


def _unb64_deliveries(body: Any) -> Any:
    if isinstance(body, dict):
        for key in ("deliveries", "messages"):
            items = body.get(key)
            if isinstance(items, list):
                for m in items:
                    if isinstance(m, dict) and isinstance(m.get("payload"), str):
                        m["payload"] = base64.b64decode(m["payload"])
    return body


def parse_retry_after(value: Any, now: Callable[[], float] = time.time) -> float | None:
    """A ``Retry-After`` value in seconds (delay-seconds or an HTTP-date, RFC 9110 10.2.3),
    within [0, ``RETRY_AFTER_CAP``]; None if absent or unreadable."""
    if value is None:
        return None
    text = str(value).strip()
    if text.isascii() and text.isdigit():
        seconds = float(text)
    else:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - now()
    return min(max(0.0, seconds), RETRY_AFTER_CAP)


def server_wait(err: RaftqError) -> float | None:
    """How long the server asked us to wait before trying again (None: it did not say, or
    the code keeps its own rhythm: see the module docstring)."""
    if err.server_code in ("no_leader", "shutting_down"):
        return None
    return err.retry_after


def is_redirect(status: int) -> bool:
    return status in (301, 302, 307, 308)


def redirected(target: str, location: str) -> str:
    """Where a redirect from ``target`` leads (``Location`` may be relative); one from https
    to plain http is refused (it would send the request, token included, in the clear)."""
    new = urljoin(target, location)
    if urlsplit(target).scheme == "https" and urlsplit(new).scheme != "https":
        raise ProtocolError(f"refusing a redirect from {target} to {new}: not https")
    return new


def retry_delay(err: RaftqError, req: Request, attempt: int, remaining: float) -> float | None:
    """Seconds to wait before trying again, or None to raise ``err`` now."""
    if isinstance(err, UnknownOutcome) and not req.idempotent:
        return None
    wait = server_wait(err)
    if isinstance(err, TopicFull) and not req.wait_full:
        return None
    if wait is not None and (
        isinstance(err, Unavailable | TopicFull | StorageFull) or err.status == 429
    ):
        if wait > remaining:
            return None  # no try could be made in time: the server's answer now
        return min(remaining, wait * random.uniform(1.0, 1.0 + RETRY_AFTER_JITTER))
    if not isinstance(err, Unavailable) or isinstance(err, TLSError) or remaining <= 0:
        return None  # (a TLS failure is a configuration error: retrying would only hide it)
    cap = NO_LEADER_CAP if err.server_code == "no_leader" else BACKOFF_CAP
    delay: float = min(cap, BACKOFF_BASE * (2**attempt)) * random.uniform(0.5, 1.0)
    return min(delay, remaining)


def node_failed(err: RaftqError) -> bool:
    """Pass over this node for a while? Not when it answered "no leader": it is alive and will
    forward to the leader (or name it) as soon as the election is over."""
    return isinstance(err, Unavailable) and err.server_code != "no_leader"


def deadline_error(
    last: RaftqError | None, req: Request, timeout: float, unknown: UnknownOutcome | None = None
) -> RaftqError:
    if isinstance(last, UnknownOutcome):
        return last
    msg = f"{req.method} {req.path}: no answer within {timeout:.1f} s"
    if last is not None:
        msg += f" (last: {last.message})"
    return final_error(RaftqTimeout(msg), unknown)


def final_error(err: RaftqError, unknown: UnknownOutcome | None) -> RaftqError:
    """The error a call ends with: once one try's outcome was unknown, a later try that got no
    definite answer (unreachable, no leader, timeout) leaves it unknown, not "not done"."""
    if unknown is None or isinstance(err, UnknownOutcome) or not isinstance(err, Unavailable):
        return err
    out = UnknownOutcome(
        f"{err.message}; an earlier try may have been applied ({unknown.message})",
        status=err.status,
    )
    out.server_code = err.server_code
    return out


def after_retry(req: Request, result: Any, unknown: UnknownOutcome | None) -> Any:
    """A settle retried after an unknown outcome: a receipt it finds stale may have been
    settled by the earlier try, so its outcome is unknown, not refused."""
    if unknown is None or not req.settle or not isinstance(result, dict):
        return result
    errors = result.get("errors")
    if isinstance(errors, list):
        for e in errors:
            if isinstance(e, dict) and e.get("code") == "receipt_stale":
                e["code"] = "outcome_unknown"
                e["message"] = (
                    f"{e.get('message', 'stale receipt')}; an earlier try may have settled it"
                )
    return result


@dataclass
class Endpoints:
    """Which node to talk to: the known leader first, else the seeds in turn, passing over a
    node that failed within the last ``cooldown`` seconds while another one is left."""

    seeds: list[str]
    leader: str | None = None
    cooldown: float = 2.0
    clock: Callable[[], float] = time.monotonic
    # Called as ``on_leader_change(old, new)`` when a leader other than the last one known is
    # learned (``old`` is None for the first).
    on_leader_change: Callable[[str | None, str], None] | None = None
    _turn: itertools.count[int] = field(default_factory=itertools.count)
    _down: dict[str, float] = field(default_factory=dict)
    _known: str | None = None  # the last leader learned (``leader`` is None while unsure)

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ValueError("at least one server URL is needed")
        self.seeds = [normalize_url(u) for u in self.seeds]

    def pick(self) -> str:
        now = self.clock()
        if self.leader is not None and self._down.get(self.leader, 0.0) <= now:
            return self.leader
        start = next(self._turn)
        n = len(self.seeds)
        for i in range(n):
            url = self.seeds[(start + i) % n]
            if self._down.get(url, 0.0) <= now:
                return url
        return self.seeds[start % n]

    def failed(self, url: str) -> None:
        self._down[url] = self.clock() + self.cooldown
        if self.leader == url:
            self.leader = None

    def no_leader(self, url: str) -> None:
        """``url`` answered that it knows no leader: if we took it for the leader, ask the
        others in turn (it may be a deposed leader cut off from the majority); it is alive, so
        no cooldown."""
        if self.leader == url:
            self.leader = None

    def learn(self, url: str | None) -> None:
        """A server named the leader's HTTP address (header or /cluster: a bare host:port
        there, reached with the seeds' scheme: a cluster is all-HTTPS or all-plain). A plain
        http address is not taken when the seeds are https (the token would go in the clear)."""
        if url and ":" in url:  # an address, not a bare node id
            scheme = urlsplit(self.seeds[0]).scheme
            if "://" not in url:
                url = f"{scheme}://{url}"
            url = normalize_url(url)
            if scheme == "https" and urlsplit(url).scheme != "https":
                return
            if self._down.get(url, 0.0) > self.clock():
                return  # we could not reach it a moment ago (e.g. an address inside Docker)
            self.leader = url
            if url not in self.seeds:
                self.seeds.append(url)
            if url != self._known:
                old, self._known = self._known, url
                if self.on_leader_change is not None:
                    self.on_leader_change(old, url)


def normalize_url(url: str) -> str:
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not a server URL: {url!r}")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when asked
    except ValueError:
        raise ValueError(f"not a server URL (bad port): {url!r}") from None
    return f"{parts.scheme}://{parts.netloc}"


def leader_from_cluster(body: Any) -> str | None:
    """The leader's API URL from a ``GET /cluster`` answer, whatever its nesting."""
    if not isinstance(body, dict):
        return None
    leader = body.get("leader")
    if isinstance(leader, dict):
        api = leader.get("api") or leader.get("api_addr")
        return str(api) if api else None
    api = body.get("leader_api")
    return str(api) if api else None


class Producer:
    """Idempotency keys ``<producer id>-<epoch>-<n>``: a retried publish is stored once. The
    random epoch makes each client instance's keys its own, so a process restarted with the
    same ``producer_id`` does not repeat the keys of its previous run (the server would take
    its new messages for duplicates and drop them for the whole dedup window)."""

    def __init__(self, producer_id: str | None = None) -> None:
        self.id = producer_id or secrets.token_hex(8)
        self._prefix = f"{self.id}-{secrets.token_hex(4)}-"
        self._n = itertools.count(1)

    def key(self) -> str:
        return f"{self._prefix}{next(self._n)}"


def message_body(
    producer: Producer,
    payload: bytes | str,
    headers: Mapping[str, str] | None = None,
    key: str | None = None,
    delay: float | None = None,
    ordering_key: str | None = None,
) -> dict[str, Any]:
    if isinstance(payload, str):
        payload = payload.encode()
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise TypeError("payload must be bytes or str")
    m: dict[str, Any] = {"payload": bytes(payload), "key": key or producer.key()}
    if headers:
        m["headers"] = dict(headers)
    if delay is not None:
        m["delay"] = delay
    if ordering_key is not None:
        m["ordering_key"] = ordering_key
    return m


def batch_body(producer: Producer, messages: Sequence[Any]) -> dict[str, Any]:
    """``messages``: payloads, or dicts with payload / headers / key / delay /
    ordering_key."""
    out = []
    for m in messages:
        if isinstance(m, Mapping):
            out.append(
                message_body(
                    producer,
                    m["payload"],
                    m.get("headers"),
                    m.get("key"),
                    m.get("delay"),
                    m.get("ordering_key"),
                )
            )
        else:
            out.append(message_body(producer, m))
    return {"messages": out}


def unavailable(url: str, exc: BaseException, sent: bool) -> RaftqError:
    """Map a transport failure: before the request was sent it is plainly retryable; after, the
    outcome is unknown."""
    if sent:
        return UnknownOutcome(f"{url}: connection lost after sending ({describe(exc)})")
    return Unavailable(f"{url}: {describe(exc)}")


def describe(exc: BaseException) -> str:
    """An exception for people: ``connection refused``, not ``ConnectionRefusedError(111, ...)``."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


def origin(url: str) -> str:
    """``scheme://host:port`` of a URL (which node a failure was with, after redirects)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def tls_error(url: str, exc: BaseException) -> TLSError:
    """A transport's ``TLSFailed`` with the node's URL: the client's error, not retried."""
    return TLSError(f"{origin(url)}: {exc}")


def raise_receipt_errors(result: Any, count: int) -> None:
    """A settle call for one receipt raises that receipt's error; for many, the caller reads
    ``result["errors"]``."""
    errors = result.get("errors") if isinstance(result, dict) else None
    if count == 1 and errors:
        raise error_from_body(409, errors[0])


def next_topics_page(page: Any, after: str | None) -> str | None:
    """The cursor of the page after ``page`` (which was asked ``after``), or None at the end
    (also when a server answers no ``next``, or one that would not move forward)."""
    nxt = page.get("next") if isinstance(page, dict) else None
    if not isinstance(nxt, str) or (after is not None and nxt <= after):
        return None
    return nxt
