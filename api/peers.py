"""Asking another instance, on a client's behalf, about the partitions it owns.

A partitioned topic's partitions may be owned by different instances (README, "Several
instances"). A request about the whole topic -- its stats, its compaction -- is answered by the
instance that receives it, as Pulsar's broker answers a partitioned topic's admin request: it
does the partitions it owns itself and asks each other owner for the rest, at the owner's
advertised URL, with the client's own ``Authorization`` header (so the owner applies the same
permission rules to the same role). A redirect from an owner that has since handed the partition
on is followed.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

import httpx

from service.names import TopicName
from service.settings import Settings


@dataclass(frozen=True)
class PeerReply:
    """What an owner answered: its status and JSON body, or why it could not be asked."""

    status: int
    body: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and 200 <= self.status < 300


class Peers:
    """One HTTP client for the requests this instance makes to the others."""

    def __init__(self, settings: Settings, timeout_s: float = 10.0) -> None:
        verify: ssl.SSLContext | bool = True
        if settings.tls_cert_file is not None:
            # The instances of a cluster share a certificate (or a CA that signed theirs).
            verify = ssl.create_default_context(cafile=str(settings.tls_cert_file))
        self._http = httpx.Client(timeout=timeout_s, follow_redirects=True, verify=verify)

    def close(self) -> None:
        self._http.close()

    def ask(
        self, owner_url: str, method: str, topic: TopicName, action: str, authorization: str | None
    ) -> PeerReply:
        """``method`` on ``{owner_url}/admin/v2/persistent/{topic}/{action}``."""
        path = f"/admin/v2/persistent/{topic.tenant}/{topic.namespace}/{topic.topic}/{action}"
        return self.request(owner_url, method, path, authorization)

    def produce(
        self, owner_url: str, topic: TopicName, messages: list[dict[str, Any]], authorization: str | None
    ) -> PeerReply:
        """The REST produce of ``messages`` (as the REST API takes them) to ``topic``'s owner."""
        path = f"/topics/persistent/{topic.tenant}/{topic.namespace}/{topic.topic}"
        return self.request(owner_url, "POST", path, authorization, body={"messages": messages})

    def request(
        self, owner_url: str, method: str, path: str, authorization: str | None, body: Any = None
    ) -> PeerReply:
        headers = {"Authorization": authorization} if authorization else {}
        try:
            response = self._http.request(method, owner_url.rstrip("/") + path, headers=headers, json=body)
        except httpx.HTTPError as e:
            return PeerReply(503, error=f"{owner_url} could not be asked: {type(e).__name__}: {e}".strip())
        try:
            answer = response.json() if response.content else None
        except ValueError:
            answer = None
        if response.status_code >= 400:
            reason = answer.get("reason") if isinstance(answer, dict) else None
            error = f"{owner_url}: {response.status_code} {reason or ''}".strip()
            return PeerReply(response.status_code, answer, error=error)
        return PeerReply(response.status_code, answer)
