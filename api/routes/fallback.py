"""Paths under the topic prefixes that no route matched.

A name part that is not a valid name (``..``, ``%2F``, spaces) often makes a path match no
route at all; the client should hear that the name is invalid (400), not just "not found".
Registered last, so every real route wins.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from service.errors import InvalidInput, NotAllowed, NotFound
from service.names import check_part

router = APIRouter(include_in_schema=False)

_KINDS = ("tenant", "namespace", "topic")


def _refuse(rest: str) -> None:
    parts = rest.split("/")
    for kind, part in zip(_KINDS, parts, strict=False):
        check_part(kind, part)  # raises InvalidInput for a bad part
    if len(parts) > 3 and parts[2] in ("", ".", ".."):
        raise InvalidInput("invalid topic name")
    raise NotFound("no such resource")


@router.api_route("/admin/v2/persistent/{rest:path}", methods=["GET", "PUT", "POST", "DELETE"])
def admin_fallback(rest: str, request: Request) -> None:
    _refuse(rest)


@router.api_route("/topics/persistent/{rest:path}", methods=["GET", "PUT", "POST", "DELETE"])
def topics_fallback(rest: str, request: Request) -> None:
    _refuse(rest)


NON_PERSISTENT = (
    "not served for non-persistent topics: they are produced and consumed over Pulsar's binary "
    "protocol; REST serves their namespace's list, a topic's stats, internalStats and partitions"
)


@router.api_route("/admin/v2/non-persistent/{rest:path}", methods=["GET", "PUT", "POST", "DELETE"])
def non_persistent_admin_fallback(rest: str, request: Request) -> None:
    _refuse_non_persistent(rest)


@router.api_route("/topics/non-persistent/{rest:path}", methods=["GET", "PUT", "POST", "DELETE"])
def non_persistent_topics_fallback(rest: str, request: Request) -> None:
    _refuse_non_persistent(rest)


def _refuse_non_persistent(rest: str) -> None:
    """405 with why, for a path that names a non-persistent topic and no route serves (400 for
    a name that is not valid, as under the persistent prefixes)."""
    for kind, part in zip(_KINDS, rest.split("/"), strict=False):
        check_part(kind, part)
    raise NotAllowed(NON_PERSISTENT)
