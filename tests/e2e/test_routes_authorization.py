"""Every route of the application, enumerated, against a real server with security on.

A route must declare an authorization rule (``api.deps``) or be on ``OPEN``; then, for each,
a request without a token is 401, a role the rule does not admit gets 403 naming the role, and
every role it admits gets past authorization (any answer but 401 and 403, never a 500). A route
added without a rule, or with a rule that does not hold, fails here.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.routing import iter_route_contexts

from api.app import create_app
from service.authorization import Rule
from service.settings import Settings
from tests.conftest import SUPERUSER, SecureServer

pytestmark = pytest.mark.e2e

# Routes anyone may call: liveness, the API description, and the fallbacks that only ever
# refuse (400/404, and 405 under the non-persistent prefixes) a path no route matched.
OPEN = {
    ("GET", "/health"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
    *((m, "/admin/v2/persistent/{rest:path}") for m in ("GET", "PUT", "POST", "DELETE")),
    *((m, "/topics/persistent/{rest:path}") for m in ("GET", "PUT", "POST", "DELETE")),
    *((m, "/admin/v2/non-persistent/{rest:path}") for m in ("GET", "PUT", "POST", "DELETE")),
    *((m, "/topics/non-persistent/{rest:path}") for m in ("GET", "PUT", "POST", "DELETE")),
    # The dashboard's page and its script and styles: they hold no data; every call the page
    # makes sends the token it asks for (tests/api/test_dashboard.py).
    ("GET", "/dashboard"),
    ("GET", "/dashboard/"),
    ("GET", "/dashboard/topics/{tenant}/{namespace}/{topic}"),
    ("GET", "/dashboard/static/{file}"),
    # Open as Pulsar's, unless COMPACTOR_AUTHENTICATE_METRICS_ENDPOINT (tests/api/test_metrics.py).
    ("GET", "/metrics"),
}

TENANT, NAMESPACE, TOPIC, OTHER_TOPIC = "rt", "ns", "t", "other"
TENANT_ADMIN, PRODUCER, CONSUMER, NOBODY = "rt-admin", "rt-producer", "rt-consumer", "nobody"

# Who each rule admits; every other role of ROLES must get 403.
ROLES = (SUPERUSER, TENANT_ADMIN, PRODUCER, CONSUMER, NOBODY)
ADMITS = {
    Rule.SUPERUSER: {SUPERUSER},
    Rule.TENANT_ADMIN: {SUPERUSER, TENANT_ADMIN},
    # PRODUCER holds produce on the namespace, CONSUMER consume on the topic only.
    Rule.PRODUCE: {SUPERUSER, TENANT_ADMIN, PRODUCER},
    Rule.CONSUME: {SUPERUSER, TENANT_ADMIN, CONSUMER},
    Rule.PRODUCE_OR_CONSUME: {SUPERUSER, TENANT_ADMIN, PRODUCER, CONSUMER},
    Rule.NAMESPACE_PRODUCE_OR_CONSUME: {SUPERUSER, TENANT_ADMIN, PRODUCER},
    Rule.AUTHENTICATED: set(ROLES),
}

# A body each route accepts, so that an admitted request does real work.
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/topics/persistent/{tenant}/{namespace}/{topic}"): {
        "messages": [{"key": "k", "value": "AA=="}]
    },
    ("PUT", "/admin/v2/tenants/{tenant}"): {"adminRoles": [TENANT_ADMIN]},
    ("POST", "/admin/v2/tenants/{tenant}"): {"adminRoles": [TENANT_ADMIN]},
    ("POST", "/admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}"): ["produce"],
    ("POST", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/permissions/{role}"): ["consume"],
    ("POST", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/compactionThreshold"): 1000,
    ("POST", "/admin/v2/namespaces/{tenant}/{namespace}/compactionThreshold"): 1000,
    ("POST", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/deduplicationEnabled"): True,
    ("POST", "/admin/v2/namespaces/{tenant}/{namespace}/deduplication"): True,
    ("POST", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/compactionPolicy"): {"retainNullKey": True},
    ("POST", "/admin/v2/namespaces/{tenant}/{namespace}/compactionPolicy"): {"retainNullKey": True},
    ("POST", "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema"): {"type": "STRING", "schema": ""},
    ("POST", "/admin/v2/schemas/{tenant}/{namespace}/{topic}/compatibility"): {
        "type": "STRING",
        "schema": "",
    },
    ("PUT", "/admin/v2/namespaces/{tenant}/{namespace}/schemaCompatibilityStrategy"): "FULL",
    ("PUT", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/schemaCompatibilityStrategy"): "FULL",
    ("POST", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/schemaCompatibilityStrategy"): "FULL",
    ("POST", "/admin/v2/namespaces/{tenant}/{namespace}/isAllowAutoUpdateSchema"): True,
    ("POST", "/admin/v2/namespaces/{tenant}/{namespace}/schemaValidationEnforced"): False,
    ("POST", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/schemaValidationEnforced"): False,
    ("POST", "/admin/v2/namespaces/{tenant}/{namespace}/backlogQuota"): {
        "limitSize": -1,
        "limitTime": -1,
        "policy": "producer_request_hold",
    },
    ("POST", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/backlogQuota"): {
        "limitSize": -1,
        "limitTime": -1,
        "policy": "producer_request_hold",
    },
    ("PUT", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions"): 2,
    ("POST", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions"): 3,
    ("POST", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/subscription/{sub}/resetcursor"): {
        "messageId": "earliest"
    },
    (
        "POST",
        "/topics/persistent/{tenant}/{namespace}/{topic}/subscription/{sub}/consumers/{consumer_id}/ack",
    ): {"messageIds": ["1:0"]},
    (
        "POST",
        "/topics/persistent/{tenant}/{namespace}/{topic}/subscription/{sub}/consumers/{consumer_id}/seek",
    ): {"messageId": "earliest"},
    (
        "POST",
        "/topics/persistent/{tenant}/{namespace}/{topic}/subscription/{sub}/consumers/{consumer_id}/negativeAcks",
    ): {"messageIds": ["1:0"]},
}


def _routes() -> list[tuple[str, str, Rule | None]]:
    settings = Settings(authentication_enabled=True, token_secret_key="data:;base64,c2VjcmV0")
    out = []
    for route in iter_route_contexts(create_app(settings).routes):
        dependant = getattr(route, "dependant", None)
        rules = [getattr(d.call, "rule", None) for d in dependant.dependencies] if dependant else []
        rules = [r for r in rules if r is not None]
        assert len(rules) <= 1, f"{route.path} has several rules: {rules}"
        for method in sorted(route.methods or ()):
            if method == "HEAD":
                continue
            out.append((method, route.path, rules[0] if rules else None))
    return out


ROUTES = _routes()


def test_every_route_has_a_rule_or_is_open() -> None:
    missing = [(m, p) for m, p, rule in ROUTES if rule is None and (m, p) not in OPEN]
    assert not missing, f"routes without an authorization rule (add one in api/deps.py): {missing}"
    opened = [(m, p) for m, p, rule in ROUTES if rule is not None and (m, p) in OPEN]
    assert not opened, f"routes on the open list that have a rule: {opened}"
    # The table covers every rule there is.
    assert {rule for _, _, rule in ROUTES if rule is not None} == set(Rule)


@pytest.fixture(scope="module")
def world(secure_server: SecureServer) -> SecureServer:
    """Tenant rt (admin rt-admin), namespace rt/ns, topic rt/ns/t with subscription s;
    rt-producer may produce in the namespace, rt-consumer consume from the topic only."""
    s = secure_server
    with httpx.Client(base_url=s.url, headers=s.headers(SUPERUSER)) as http:
        assert http.put(f"/admin/v2/tenants/{TENANT}", json={"adminRoles": [TENANT_ADMIN]}).status_code == 204
        assert http.put(f"/admin/v2/namespaces/{TENANT}/{NAMESPACE}").status_code == 204
        for topic in (TOPIC, OTHER_TOPIC):
            assert http.put(f"/admin/v2/persistent/{TENANT}/{NAMESPACE}/{topic}").status_code == 204
        perms = f"/admin/v2/namespaces/{TENANT}/{NAMESPACE}/permissions"
        assert http.post(f"{perms}/{PRODUCER}", json=["produce"]).status_code == 204
        tperms = f"/admin/v2/persistent/{TENANT}/{NAMESPACE}/{TOPIC}/permissions"
        assert http.post(f"{tperms}/{CONSUMER}", json=["consume"]).status_code == 204
        sub = f"/admin/v2/persistent/{TENANT}/{NAMESPACE}/{TOPIC}/subscription/s"
        assert http.put(sub, params={"initialPosition": "earliest"}).status_code == 204
    return s


def _path(template: str, rule: Rule) -> str:
    # Changes only a tenant admin may make (deleting, triggering compaction) act on a topic of
    # their own, so that the table leaves rt/ns/t as the others need it.
    topic = OTHER_TOPIC if rule in (Rule.TENANT_ADMIN, Rule.SUPERUSER) else TOPIC
    # The table catalog's namespaces are the tenant and namespace, joined by the unit separator.
    namespace = f"{TENANT}%1F{NAMESPACE}" if template.startswith("/iceberg/") else NAMESPACE
    return template.format(
        domain="persistent",
        tenant=TENANT,
        namespace=namespace,
        table=topic,
        topic=topic,
        sub="s",
        consumer_id="no-such-consumer",
        role="someone",
        timestamp=0,
        ledger_id=1,
        entry_id=0,
        version=0,
    )


SECURED = [(m, p, r) for m, p, r in ROUTES if r is not None]
IDS = [f"{m} {p}" for m, p, _ in SECURED]


@pytest.mark.parametrize(("method", "template", "rule"), SECURED, ids=IDS)
def test_route_refuses_without_a_token(world: SecureServer, method: str, template: str, rule: Rule) -> None:
    r = httpx.request(method, world.url + _path(template, rule), json=BODIES.get((method, template)))
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert "authentication required" in r.json()["reason"]


@pytest.mark.parametrize(("method", "template", "rule"), SECURED, ids=IDS)
def test_route_admits_exactly_the_roles_of_its_rule(
    world: SecureServer, method: str, template: str, rule: Rule
) -> None:
    path = _path(template, rule)
    body = BODIES.get((method, template))
    for role in ROLES:
        r = httpx.request(method, world.url + path, json=body, headers=world.headers(role))
        if role in ADMITS[rule]:
            assert r.status_code not in (401, 403, 500), (role, r.status_code, r.text)
        else:
            assert r.status_code == 403, (role, r.status_code, r.text)
            reason = r.json()["reason"]
            assert f"role {role!r} is not authorized to {rule.value}" in reason, reason
