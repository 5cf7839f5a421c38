"""The dashboard at ``/dashboard/``: one page of plain HTML and JS served by the service
itself (``api/dashboard/``; nothing from a CDN, no build step), and the two JSON views it
needs that the admin API does not give: every topic's summary, and a topic's applied
policies with where each value comes from. Everything else it reads from the admin API,
with the same token a REST client would send."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from api.deps import Authenticated, BrokerDep, PoliciesDep, TenantAdmin, TopicDep
from service.authorization import Authorizer, Rule
from service.errors import NotFound
from service.names import TopicName
from service.overview import topics_overview

router = APIRouter(prefix="/dashboard", tags=["dashboard"])

ASSETS = Path(__file__).resolve().parent.parent / "dashboard"
# The files a browser may fetch, by name: nothing else under the directory is served.
STATIC = {"app.js": "text/javascript", "style.css": "text/css"}
PAGE: dict[int | str, dict[str, Any]] = {
    200: {"description": "the dashboard's page (its script picks the view from the path)"}
}


def _page() -> HTMLResponse:
    return HTMLResponse((ASSETS / "index.html").read_text(encoding="utf-8"))


@router.get("", include_in_schema=False)
async def dashboard_root() -> RedirectResponse:
    return RedirectResponse("/dashboard/", status_code=308)


@router.get("/", response_class=HTMLResponse, responses=PAGE)
async def topics_page() -> HTMLResponse:
    """The topic list."""
    return _page()


@router.get(
    "/topics/{tenant}/{namespace}/{topic}",
    response_class=HTMLResponse,
    responses={**PAGE, 400: {"description": "an invalid name part"}},
)
async def topic_page(name: TopicDep) -> HTMLResponse:
    """One topic: ledgers, compacted ledger, cursors, run history, "Compact now", policies."""
    return _page()


@router.get(
    "/static/{file}",
    response_class=FileResponse,
    responses={
        200: {"description": "a script or style sheet of the page"},
        404: {"description": "no such file"},
    },
)
async def static_file(file: str) -> FileResponse:
    if file not in STATIC:
        raise NotFound(f"no dashboard file {file!r}")
    return FileResponse(ASSETS / file, media_type=STATIC[file], headers={"Cache-Control": "no-cache"})


@router.get(
    "/api/topics",
    responses={200: {"description": "one summary per topic, by name"}},
    dependencies=[Authenticated],
)
def topics_summary(request: Request, broker: BrokerDep) -> list[dict[str, Any]]:
    """Every topic the caller may look up (with authorization on: a tenant admin's, or one it
    may produce to or consume from): storage size, backlog, compacted size and the share
    saved, last compaction."""
    authorizer: Authorizer | None = request.app.state.authorizer
    role: str | None = getattr(request.state, "role", None)
    overview = topics_overview(broker)
    if authorizer is not None and role is not None:
        overview = [
            t
            for t in overview
            if authorizer.may(role=role, rule=Rule.PRODUCE_OR_CONSUME, topic=TopicName.parse(t.name))
        ]
    return [asdict(t) for t in overview]


@router.get(
    "/api/topics/{tenant}/{namespace}/{topic}/policies",
    responses={
        200: {"description": "each policy field: its applied value and its source"},
        400: {"description": "an invalid name part"},
        404: {"description": "no such topic"},
    },
    dependencies=[TenantAdmin],
)
def applied_policies(name: TopicDep, broker: BrokerDep, policies: PoliciesDep) -> dict[str, dict[str, Any]]:
    """Each field's applied value and where it comes from: topic, namespace, default or unset."""
    broker.topic(name)
    return {f: {"value": v, "source": src} for f, (v, src) in policies.applied(name).items()}
