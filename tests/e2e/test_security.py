"""Authentication, tenants, namespaces and permissions, the client and the CLI with tokens,
and the audit log, against one real server with security on (``secure_server``)."""

from __future__ import annotations

import base64
import json
import time

import httpx
import jwt
import pytest
from typer.testing import CliRunner

from api.client import (
    AuthenticationError,
    AuthenticationToken,
    AuthorizationError,
    Client,
    Conflict,
    NotFound,
)
from api.main import app
from service.tokens import create_key_pair, create_token, load_private_key
from tests.conftest import SUPERUSER, SecureServer

pytestmark = pytest.mark.e2e


def admin(s: SecureServer) -> Client:
    return Client(s.url, authentication=AuthenticationToken(s.token(SUPERUSER)))


# ------------------------------------------------------------------------- authentication


def _refusals(s: SecureServer) -> dict[str, dict[str, str]]:
    now = int(time.time())
    private, _ = create_key_pair("RS256")
    unsigned = jwt.encode({"sub": SUPERUSER}, None, algorithm="none")  # alg: none
    return {
        "no header": {},
        "not bearer": {"Authorization": "Basic YWRtaW46YWRtaW4="},
        "empty bearer": {"Authorization": "Bearer"},
        "not a jwt": {"Authorization": "Bearer not.a.token"},
        "garbage": {"Authorization": "Bearer ~~~~"},
        "wrong secret": {"Authorization": "Bearer " + jwt.encode({"sub": SUPERUSER}, b"x" * 32, "HS256")},
        "alg none": {"Authorization": "Bearer " + unsigned},
        "other algorithm": {
            "Authorization": "Bearer "
            + jwt.encode({"sub": SUPERUSER}, load_private_key(private), algorithm="RS256")
        },
        "expired": {"Authorization": "Bearer " + s.token(SUPERUSER, exp=now - 10)},
        "not yet valid": {"Authorization": "Bearer " + s.token(SUPERUSER, nbf=now + 3600)},
        "no role": {"Authorization": "Bearer " + jwt.encode({"x": 1}, s.secret_key, "HS256")},
        "role not a string": {"Authorization": "Bearer " + s.token(123)},  # type: ignore[arg-type]
    }


def test_bad_tokens_get_401_with_a_reason(secure_server: SecureServer) -> None:
    s = secure_server
    for what, headers in _refusals(s).items():
        r = httpx.get(f"{s.url}/admin/v2/tenants", headers=headers)
        assert r.status_code == 401, (what, r.status_code, r.text)
        assert r.headers["www-authenticate"].startswith("Bearer"), what
        reason = r.json()["reason"]
        assert isinstance(reason, str) and reason, what
        token = headers.get("Authorization", "").partition(" ")[2]
        assert not token or token not in reason, f"{what}: the reason echoes the token"
    expired = httpx.get(f"{s.url}/admin/v2/tenants", headers=_refusals(s)["expired"])
    assert expired.json()["reason"] == "the token has expired"


def test_health_and_the_api_description_are_open(secure_server: SecureServer) -> None:
    assert httpx.get(f"{secure_server.url}/health").json()["status"] == "ok"
    doc = httpx.get(f"{secure_server.url}/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"


def test_a_cached_token_is_refused_once_it_expires(secure_server: SecureServer) -> None:
    s = secure_server
    headers = {"Authorization": "Bearer " + s.token(SUPERUSER, exp=int(time.time()) + 2)}
    assert httpx.get(f"{s.url}/admin/v2/tenants", headers=headers).status_code == 200
    time.sleep(2.1)
    assert httpx.get(f"{s.url}/admin/v2/tenants", headers=headers).status_code == 401


# ------------------------------------------------------------------- tenants and namespaces


def test_public_default_exists_from_the_first_start(secure_server: SecureServer) -> None:
    with admin(secure_server) as c:
        assert "public" in c.admin.tenants.list()
        assert "public/default" in c.admin.namespaces.list("public")


def test_tenants_namespaces_and_their_life_cycle(secure_server: SecureServer) -> None:
    with admin(secure_server) as c:
        c.admin.tenants.create("life", admin_roles=["life-admin"], allowed_clusters=["standalone"])
        assert c.admin.tenants.get("life") == {
            "adminRoles": ["life-admin"],
            "allowedClusters": ["standalone"],
        }
        with pytest.raises(Conflict):
            c.admin.tenants.create("life")
        c.admin.tenants.update("life", admin_roles=["life-admin", "other"])
        assert c.admin.tenants.get("life")["adminRoles"] == ["life-admin", "other"]

        # A topic only in a namespace that exists (404, as Pulsar).
        with pytest.raises(NotFound, match="namespace life/ns does not exist"):
            c.admin.topics.create("life/ns/t")
        with pytest.raises(NotFound, match="tenant nope does not exist"):
            c.admin.namespaces.create("nope/ns")
        c.admin.namespaces.create("life/ns")
        with pytest.raises(Conflict):
            c.admin.namespaces.create("life/ns")
        c.admin.topics.create("life/ns/t")
        c.admin.namespaces.grant_permission("life/ns", "reader", ["consume"])

        # Not empty: 409, for the namespace and the tenant.
        with pytest.raises(Conflict, match="still has topics"):
            c.admin.namespaces.delete("life/ns")
        with pytest.raises(Conflict, match="still has namespaces"):
            c.admin.tenants.delete("life")
        c.admin.topics.delete("life/ns/t")
        c.admin.namespaces.delete("life/ns")
        assert c.admin.namespaces.list("life") == []
        c.admin.tenants.delete("life")
        with pytest.raises(NotFound):
            c.admin.tenants.get("life")
        # Made again, the namespace has none of the old grants.
        c.admin.tenants.create("life")
        c.admin.namespaces.create("life/ns")
        assert c.admin.namespaces.permissions("life/ns") == {}


# ------------------------------------------------------------------------------ permissions


@pytest.fixture
def orders(secure_server: SecureServer) -> str:
    """Tenant ``perm`` (admin ``perm-admin``), namespace perm/ns, topic perm/ns/orders."""
    with admin(secure_server) as c:
        try:
            c.admin.tenants.create("perm", admin_roles=["perm-admin"])
            c.admin.namespaces.create("perm/ns")
            c.admin.topics.create("perm/ns/orders")
        except Conflict:
            pass
    return "perm/ns/orders"


def test_grants_take_effect_at_once_and_revoking_them_too(secure_server: SecureServer, orders: str) -> None:
    s = secure_server
    app_client = Client(s.url, authentication=AuthenticationToken(s.token("app")))
    with admin(s) as c, app_client:
        with pytest.raises(AuthorizationError, match="role 'app' is not authorized to look up"):
            app_client.create_producer(orders)

        c.admin.namespaces.grant_permission("perm/ns", "app", ["produce"])
        assert c.admin.namespaces.permissions("perm/ns")["app"] == ["produce"]
        producer = app_client.create_producer(orders)
        producer.send(b"v", key="k")
        # produce does not allow consuming ...
        with pytest.raises(AuthorizationError, match="consume from"):
            app_client.subscribe(orders, "app-sub", initial_position="earliest")
        # ... a topic grant adds it; the topic's permissions show its own and its namespace's.
        c.admin.topics.grant_permission(orders, "app", ["consume"])
        assert c.admin.topics.permissions(orders)["app"] == ["consume", "produce"]
        consumer = app_client.subscribe(orders, "app-sub", initial_position="earliest")
        msg = consumer.receive(timeout_millis=5000)
        assert msg.value() == b"v"
        consumer.acknowledge(msg)
        consumer.close()
        assert app_client.admin.topics.stats(orders)["subscriptions"]["app-sub"]["msgBacklog"] == 0

        c.admin.namespaces.revoke_permission("perm/ns", "app")
        with pytest.raises(AuthorizationError, match="role 'app' is not authorized to produce to"):
            producer.send(b"v2", key="k")
        c.admin.topics.revoke_permission(orders, "app")
        with pytest.raises(AuthorizationError):
            app_client.admin.topics.stats(orders)
        with pytest.raises(NotFound):
            c.admin.topics.revoke_permission(orders, "app")


def test_a_tenant_admin_rules_its_tenant_only(secure_server: SecureServer, orders: str) -> None:
    s = secure_server
    with Client(s.url, authentication=AuthenticationToken(s.token("perm-admin"))) as c:
        c.admin.topics.create("perm/ns/admin-made")
        c.admin.topics.set_compaction_threshold("perm/ns/admin-made", 1024)
        c.admin.namespaces.grant_permission("perm/ns", "someone", ["produce", "consume"])
        c.create_producer(orders).send(b"x", key="k")
        c.admin.topics.compact("perm/ns/admin-made")  # empty: done at once, without Spark
        assert c.admin.topics.wait_for_compaction("perm/ns/admin-made", timeout=30).status == "SUCCESS"
        c.admin.topics.delete("perm/ns/admin-made")
        assert c.admin.tenants.get("perm")["adminRoles"] == ["perm-admin"]
        with pytest.raises(AuthorizationError, match="it needs to be a superuser"):
            c.admin.tenants.create("mine")
        with pytest.raises(AuthorizationError, match="administer tenants"):
            c.admin.tenants.list()
        with pytest.raises(AuthorizationError, match="role 'perm-admin' is not authorized to administer"):
            c.admin.namespaces.create("public/mine")
        with pytest.raises(AuthorizationError):
            c.create_producer("public/default/x").send(b"x")


def test_bodies_are_checked(secure_server: SecureServer, orders: str) -> None:
    s = secure_server
    h = s.headers(SUPERUSER)
    bad_action = httpx.post(f"{s.url}/admin/v2/namespaces/perm/ns/permissions/r", json=["fly"], headers=h)
    assert bad_action.status_code == 422
    bad_role = httpx.post(
        f"{s.url}/admin/v2/namespaces/perm/ns/permissions/a%20b", json=["produce"], headers=h
    )
    assert bad_role.status_code == 422
    bad_tenant = httpx.put(f"{s.url}/admin/v2/tenants/x", json={"adminRoles": "a"}, headers=h)
    assert bad_tenant.status_code == 422
    assert httpx.put(f"{s.url}/admin/v2/tenants/..", headers=h).status_code in (400, 404)


# ------------------------------------------------------------------------- client and CLI


def test_the_client_reads_a_token_function_again_on_401(secure_server: SecureServer) -> None:
    s = secure_server
    tokens = iter([s.token(SUPERUSER, exp=int(time.time()) - 5), s.token(SUPERUSER)])
    calls = []

    def supplier() -> str:
        calls.append(1)
        return next(tokens)

    auth = AuthenticationToken(supplier)
    assert "eyJ" not in repr(auth)
    with Client(s.url, authentication=auth) as c:
        assert "public" in c.admin.tenants.list()  # expired, 401, read again, retried
        assert "public" in c.admin.tenants.list()
    assert len(calls) == 2
    with Client(s.url) as c, pytest.raises(AuthenticationError, match="authentication required"):
        c.admin.tenants.list()
    with Client(s.url, authentication=AuthenticationToken("bad")) as c, pytest.raises(AuthenticationError):
        c.admin.tenants.list()


def test_cli_takes_a_token_by_option_by_environment_and_by_file(
    secure_server: SecureServer, orders: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = secure_server
    token = s.token(SUPERUSER)
    runner = CliRunner()
    refused = runner.invoke(app, ["topics", "--url", s.url, "list", "perm/ns"])
    assert refused.exit_code == 1 and "authentication required" in refused.stderr
    by_option = runner.invoke(app, ["topics", "list", "perm/ns", "--url", s.url, "--auth-token", token])
    assert by_option.exit_code == 0 and "persistent://perm/ns/orders" in by_option.stdout
    before = runner.invoke(app, ["topics", "--url", s.url, "--auth-token", token, "stats", orders])
    assert before.exit_code == 0 and "msgInCounter" in before.stdout
    (tmp_path / "token").write_text(token + "\n")
    by_file = runner.invoke(
        app, ["topics", "--url", s.url, "--auth-token", f"file://{tmp_path / 'token'}", "stats", orders]
    )
    assert by_file.exit_code == 0, by_file.output
    monkeypatch.setenv("COMPACTOR_AUTH_TOKEN", token)
    by_env = runner.invoke(app, ["topics", "--url", s.url, "produce", orders, "-k", "a", "-m", "v"])
    assert by_env.exit_code == 0, by_env.output
    assert token not in by_env.output
    monkeypatch.setenv("COMPACTOR_AUTH_TOKEN", s.token("nobody"))
    denied = runner.invoke(app, ["topics", "--url", s.url, "delete", orders])
    assert denied.exit_code == 1 and "role 'nobody' is not authorized to administer" in denied.stderr


# ------------------------------------------------------------------------------ audit log


def test_admin_changes_are_audited_and_tokens_never_logged(secure_server: SecureServer) -> None:
    s = secure_server
    token = s.token(SUPERUSER)
    h = {"Authorization": f"Bearer {token}"}
    assert httpx.put(f"{s.url}/admin/v2/tenants/audited", headers=h).status_code == 204
    assert (
        httpx.put(f"{s.url}/admin/v2/namespaces/audited/ns", headers=s.headers("intruder")).status_code == 403
    )
    assert httpx.put(f"{s.url}/admin/v2/namespaces/audited/ns").status_code == 401
    log = s.server.log.read_text()
    assert "role=admin action=create_tenant resource=/admin/v2/tenants/audited outcome=success" in log
    assert (
        "role=intruder action=create_namespace resource=/admin/v2/namespaces/audited/ns outcome=denied" in log
    )
    assert (
        "role=- action=create_namespace resource=/admin/v2/namespaces/audited/ns outcome=unauthenticated"
        in log
    )
    assert token not in log and base64.b64encode(s.secret_key).decode() not in log


def test_rs256_and_es256_tokens_against_a_public_key(tmp_path) -> None:
    """The service checks tokens made with a private key against the public key alone."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from service.settings import Settings

    for alg in ("RS256", "ES256"):
        private, public = create_key_pair(alg)
        settings = Settings(
            data_dir=tmp_path / alg,
            authentication_enabled=True,
            token_public_key="data:;base64," + base64.b64encode(public).decode(),
            spark_warmup=False,
        )
        token = create_token(subject="app", private_key=private)
        assert json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))["alg"] == alg
        other = create_token(subject="app", private_key=create_key_pair(alg)[0])
        with TestClient(create_app(settings)) as c:
            assert c.get("/admin/v2/tenants", headers={"Authorization": f"Bearer {token}"}).status_code == 200
            r = c.get("/admin/v2/tenants", headers={"Authorization": f"Bearer {other}"})
            assert r.status_code == 401 and "signature" in r.json()["reason"]
