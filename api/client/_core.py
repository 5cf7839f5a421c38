"""The sans-IO core: names and paths, the effects (``_Call``, ``_Sleep``), the one place a request
is built (``_BaseClient._build``), a response decoded (``_decode``) and httpx's errors translated
(``_transport_errors``), what every producer, consumer and reader shares (``_Child``), and what
they are given of the client that runs them (``_SyncRunner``, ``_AsyncRunner``)."""

from __future__ import annotations

import contextlib
import random
import time
import weakref
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeAlias, TypeVar
from urllib.parse import quote

import httpx
import orjson

from api.client.auth import AuthenticationToken
from api.client.errors import _ERRORS, AlreadyClosed, ServerError, TransportError
from api.client.message import MessageIdLike, _as_id

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8080"
#: The reserved cursor that holds the compaction horizon; not a subscription a consumer may use.
COMPACTION_SUBSCRIPTION = "__compaction"


_RETRY_FIRST_S = 0.05  # the first back-off after a 503, doubling ...
_RETRY_MAX_S = 2.0  # ... up to this, or the server's Retry-After if it asks for longer


# --------------------------------------------------------------------------------- names


def _q(part: str) -> str:
    # "/" in a part becomes %2F, which the server refuses (400) instead of routing elsewhere.
    return quote(part, safe="")


def _split(text: str, n: int, what: str, example: str) -> list[str]:
    if not isinstance(text, str):
        raise TypeError(f"a {what} name is a str, not {type(text).__name__}")
    parts = text.split("/")
    if len(parts) != n or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid {what} name {text!r}: expected {example}")
    return parts


@dataclass(frozen=True, slots=True)
class _Topic:
    tenant: str
    namespace: str
    name: str

    @classmethod
    def parse(cls, topic: str) -> _Topic:
        rest = topic
        if isinstance(topic, str) and "://" in topic:
            domain, _, rest = topic.partition("://")
            if domain != "persistent":
                raise ValueError(f"invalid topic name {topic!r}: only persistent:// topics exist")
        t, n, x = _split(rest, 3, "topic", "persistent://tenant/namespace/topic or tenant/namespace/topic")
        return cls(t, n, x)

    def __str__(self) -> str:
        return f"persistent://{self.tenant}/{self.namespace}/{self.name}"

    @property
    def _parts(self) -> str:
        return f"{_q(self.tenant)}/{_q(self.namespace)}/{_q(self.name)}"

    @property
    def admin(self) -> str:
        return f"/admin/v2/persistent/{self._parts}"

    @property
    def data(self) -> str:
        return f"/topics/persistent/{self._parts}"

    def subscription(self, name: str) -> str:
        if not isinstance(name, str) or not name:
            raise ValueError("a subscription name is a non-empty str")
        return f"{self.admin}/subscription/{_q(name)}"


def partition_topic(topic: _Topic, index: int) -> _Topic:
    """Partition ``index`` of a partitioned topic, as Pulsar names it."""
    return _Topic(topic.tenant, topic.namespace, f"{topic.name}-partition-{index}")


def _op_partitions(topic: _Topic) -> _Op[int]:
    """How many partitions ``topic`` has (0: a plain topic, or none yet)."""
    body = yield _Call("GET", f"{topic.admin}/partitions")
    return int(body["partitions"])


def _namespace(namespace: str) -> str:
    t, n = _split(namespace.removeprefix("persistent://"), 2, "namespace", "tenant/namespace")
    return f"{_q(t)}/{_q(n)}"


def _position(value: MessageIdLike) -> str:
    """An initial position of a new subscription: only earliest or latest."""
    pos = str(value)
    if pos not in ("earliest", "latest"):
        raise ValueError(f"initial position is 'earliest' or 'latest', not {pos!r}")
    return pos


def _seek_body(target: MessageIdLike | int) -> dict[str, Any]:
    if isinstance(target, bool):
        raise TypeError("seek to a MessageId, an 'L:E' string, or a publish time in ms (int)")
    if isinstance(target, int):
        return {"publishTime": target}
    return {"messageId": str(_as_id(target))}


# --------------------------------------------------------------------- effects and driving


@dataclass(frozen=True, slots=True)
class _Call:
    """An HTTP request to make; its result is the decoded JSON body (``None`` when empty)."""

    method: str
    path: str
    params: Mapping[str, str | int | bool] | None = None
    body: Any = None  # JSON; None sends no body
    wait: float = 0.0  # seconds the server may hold the request (a long poll), added to the timeout


@dataclass(frozen=True, slots=True)
class _Sleep:
    seconds: float


_Effect: TypeAlias = _Call | _Sleep
_Op: TypeAlias = Generator[_Effect, Any, T]


@contextlib.contextmanager
def _transport_errors(request: httpx.Request) -> Iterator[None]:
    """The one place httpx's exceptions become ``TransportError``."""
    try:
        yield
    except httpx.TimeoutException as e:
        raise TransportError(f"timed out: {request.method} {request.url}") from e
    except httpx.RequestError as e:
        raise TransportError(f"{type(e).__name__}: {e or 'failed'} ({request.method} {request.url})") from e


_MAX_REDIRECTS = 5
_TOPIC_PREFIXES = ("/admin/v2/persistent/", "/topics/persistent/", "/lookup/v2/topic/persistent/")


def _topic_key(path: str) -> str | None:
    """The topic a request path is about ("t/n/topic", as encoded), or None."""
    for prefix in _TOPIC_PREFIXES:
        if path.startswith(prefix):
            parts = path[len(prefix) :].split("/", 3)
            if len(parts) >= 3 and all(parts[:3]):
                return "/".join(parts[:3])
    return None


def _never_sent(error: TransportError) -> bool:
    """Whether the request could not even be sent (no connection): safe to send elsewhere."""
    return isinstance(error.__cause__, httpx.ConnectError | httpx.ConnectTimeout)


def _decode(response: httpx.Response) -> Any:
    """The one place a response becomes a result (its JSON, ``None`` when empty) or an error."""
    status = response.status_code
    if 200 <= status < 300:
        if status == 204 or not response.content:
            return None
        try:
            # orjson: a page of messages decodes several times faster than with json.
            return orjson.loads(response.content)
        except ValueError:
            raise ServerError(status, f"the server sent invalid JSON ({response.request.url})") from None
    reason: str | None = None
    try:
        body = response.json()
        if isinstance(body, dict) and isinstance(body.get("reason"), str):
            reason = body["reason"]
    except ValueError:
        pass
    if reason is None:
        reason = response.text.strip()[:500] or response.reason_phrase or f"HTTP {status}"
    raise _ERRORS.get(status, ServerError)(status, reason)


class _BaseClient:
    """What the sync and async clients share: configuration and request building."""

    def __init__(
        self,
        service_url: str,
        timeout: float,
        authentication: AuthenticationToken | None = None,
        retry_unavailable_s: float = 30.0,
    ) -> None:
        urls = [u.strip().rstrip("/") for u in str(service_url).split(",") if u.strip()]
        if not urls or not all(u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"the service URL is http:// or https://, not {service_url!r}")
        url = urls[0]
        if timeout <= 0:
            raise ValueError("timeout is a positive number of seconds")
        if authentication is not None and not isinstance(authentication, AuthenticationToken):
            raise TypeError("authentication is an AuthenticationToken")
        if retry_unavailable_s < 0:
            raise ValueError("retry_unavailable_s is 0 (never retry a 503) or more seconds")
        self.service_url = url
        self.service_urls = urls
        self._service_index = 0
        # Where each topic's requests go (its owner, learnt from a redirect), by "t/n/topic".
        self._owners: dict[str, str] = {}
        self.timeout = float(timeout)
        self._authentication = authentication
        self.retry_unavailable_s = float(retry_unavailable_s)
        self._closed = False
        # Consumers and table views hold server or thread state that close() releases.
        self._children: weakref.WeakSet[Any] = weakref.WeakSet()

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed("the client is closed")

    def _build(self, http: httpx.Client | httpx.AsyncClient, call: _Call) -> httpx.Request:
        """The one place a request is built: to the topic's owner when one is known, else to
        the service URL (the token goes with it either way)."""
        has_body = call.body is not None
        headers = {"Content-Type": "application/json"} if has_body else {}
        if self._authentication is not None:
            headers["Authorization"] = self._authentication.header()
        key = _topic_key(call.path)
        base = self._owners.get(key) if key is not None else None
        if base is None:
            base = self.service_urls[self._service_index]
        return http.build_request(
            call.method,
            call.path if base == self.service_url else base + call.path,
            params=dict(call.params) if call.params else None,
            # orjson: a batch of a thousand messages encodes several times faster than with json.
            content=orjson.dumps(call.body) if has_body else None,
            headers=headers or None,
            timeout=httpx.Timeout(self.timeout + call.wait),
        )

    def _renew_after(self, response: httpx.Response) -> bool:
        """Whether to send a request again: a 401 with a token that can be read anew."""
        if response.status_code != 401 or self._authentication is None or not self._authentication.renewable:
            return False
        self._authentication.renew()
        return True

    def _follow(self, response: httpx.Response, call: _Call, hops: int) -> bool:
        """Whether to send the request again after a redirect to the topic's owner (and
        remember the owner); a 503 forgets the owner, so that the retry looks the topic up."""
        key = _topic_key(call.path)
        if response.status_code == 503 and key is not None:
            self._owners.pop(key, None)
            return False
        if response.status_code not in (307, 308):
            return False
        location = response.headers.get("location", "")
        target = httpx.URL(location)
        if key is None or not target.scheme or not target.host or hops >= _MAX_REDIRECTS:
            return False
        self._owners[key] = f"{target.scheme}://{target.netloc.decode('ascii')}"
        return True

    def _unreachable(self, call: _Call, attempt: int, started: float) -> float | None:
        """Seconds to wait before trying elsewhere after an instance could not be reached (the
        request never left), or None to raise: the topic's remembered owner is forgotten, or
        the next service URL is tried."""
        key = _topic_key(call.path)
        if key is not None and self._owners.pop(key, None) is not None:
            pass
        elif len(self.service_urls) > 1:
            self._service_index = (self._service_index + 1) % len(self.service_urls)
        else:
            return None
        delay = min(_RETRY_MAX_S, _RETRY_FIRST_S * 2.0**attempt) * (1 + random.random() / 4)
        if time.monotonic() + delay - started > self.retry_unavailable_s:
            return None
        return delay

    def _retry_delay(self, response: httpx.Response, attempt: int, started: float) -> float | None:
        """Seconds to wait before sending a request again that was answered ``response``, or
        None to take the answer. Only a 503 is retried: the server changed nothing for it."""
        if response.status_code != 503:
            return None
        delay = min(_RETRY_MAX_S, _RETRY_FIRST_S * 2.0**attempt)
        with contextlib.suppress(ValueError):
            delay = max(delay, float(response.headers.get("Retry-After", 0)))
        delay *= 1 + random.random() / 4  # jitter: clients refused together do not return together
        if time.monotonic() + delay - started > self.retry_unavailable_s:
            return None
        return delay

    @staticmethod
    def _headers() -> dict[str, str]:
        return {"User-Agent": "compactor-client/0.1", "Accept": "application/json"}


class _Runner(Protocol):
    """What a producer, consumer, reader, table view or admin is given: the client that runs its
    operations, ``Client`` or ``AsyncClient``, named by what they use of it (so that their
    modules need not import the runners, which import them)."""

    timeout: float
    _closed: bool
    _owners: dict[str, str]

    def _check_open(self) -> None: ...


class _SyncRunner(_Runner, Protocol):
    """The sync runner (``Client``): ``_run`` returns an operation's result."""

    def _run(self, op: _Op[T]) -> T: ...


class _AsyncRunner(_Runner, Protocol):
    """The async runner (``AsyncClient``): ``_run`` is awaited for an operation's result."""

    async def _run(self, op: _Op[T]) -> T: ...


_C = TypeVar("_C", bound=_Runner)


class _Child(Generic[_C]):
    def __init__(self, client: _C, topic: _Topic) -> None:
        self._client = client
        self._topic = topic
        self._closed = False

    def topic(self) -> str:
        """The full topic name, ``persistent://tenant/namespace/topic``."""
        return str(self._topic)

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed(f"{type(self).__name__} of {self._topic} is closed")
        self._client._check_open()
