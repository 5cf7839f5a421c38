"""Several authentication providers at once, over REST and the binary protocol, judged by the
official ``pulsar-client``: token and basic side by side, a wrong password, a method no provider
serves, and the anonymous role reading what it is granted and refused what it is not.

Two servers, as Pulsar's brokers would be configured: one as pulsar-client-python's own CI runs
its broker (token and basic providers, authorization on, the anonymous role ``anonymous``, a
``private/auth`` namespace only named roles may use), one with no anonymous role and an
authenticated ``/metrics``.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import jwt
import pulsar
import pytest
from passlib.hash import apr_md5_crypt, des_crypt

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import command, encode
from service.tokens import create_secret_key
from tests.conftest import Server
from tests.e2e.raw_wire import raw, read_frame

pytestmark = pytest.mark.e2e

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
SUPERUSER = "admin"
ANONYMOUS = "anonymous"
PASSWORDS = {"admin": "123456", "reader": "r3ader-pw", "legacy": "crypt-pw"}


@dataclass(frozen=True)
class Secured:
    server: Server
    secret_key: bytes

    @property
    def url(self) -> str:
        return self.server.url

    def bearer(self, role: str) -> dict[str, str]:
        return {"Authorization": "Bearer " + jwt.encode({"sub": role}, self.secret_key, algorithm="HS256")}

    def client(
        self, authentication: pulsar.Authentication | None = None, *, http: bool = False
    ) -> pulsar.Client:
        return pulsar.Client(
            self.url if http else self.server.pulsar_url,
            authentication=authentication,
            operation_timeout_seconds=10,
            logger=QUIET,
        )


def basic(user: str, password: str | None = None) -> dict[str, str]:
    pair = f"{user}:{PASSWORDS[user] if password is None else password}"
    return {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}


def _htpasswd() -> str:
    # Each hash format Pulsar's basic provider checks: $apr1$ (htpasswd -m) and crypt (-d).
    return (
        "admin:$apr1$FG4AO6aX$KGYPuMoLUou3i6vUkPUUf.\n"  # pulsar-client-python's own test file
        f"reader:{apr_md5_crypt.hash(PASSWORDS['reader'])}\n"
        f"legacy:{des_crypt.hash(PASSWORDS['legacy'])}\n"
    )


def _start(tmp_path_factory: pytest.TempPathFactory, name: str, **env: str) -> Secured:
    key = create_secret_key()
    conf = tmp_path_factory.mktemp(name) / "htpasswd"
    conf.write_text(_htpasswd())
    s = Server(
        conf.parent / "data",
        env={
            "COMPACTOR_AUTHENTICATION_ENABLED": "true",
            "COMPACTOR_AUTHORIZATION_ENABLED": "true",
            # As broker.conf names them (the Java class names carry over).
            "COMPACTOR_AUTHENTICATION_PROVIDERS": "org.apache.pulsar.broker.authentication."
            "AuthenticationProviderToken,org.apache.pulsar.broker.authentication.AuthenticationProviderBasic",
            "COMPACTOR_BASIC_AUTH_CONF": str(conf),
            "COMPACTOR_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(key).decode(),
            "COMPACTOR_SUPERUSER_ROLES": f"{SUPERUSER},superUser",
            **env,
        },
    )
    s.start()
    return Secured(s, key)


@pytest.fixture(scope="module")
def anonymous_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """As pulsar-client-python's CI configures its broker: an anonymous role with produce and
    consume on public/default, and private/auth for token-principal and reader only."""
    s = _start(
        tmp_path_factory,
        "anon",
        COMPACTOR_ANONYMOUS_USER_ROLE=ANONYMOUS,
        COMPACTOR_AUTHENTICATE_METRICS_ENDPOINT="true",
    )
    with httpx.Client(base_url=s.url, headers=basic("admin"), timeout=30) as http:
        for path, body in (
            (f"/admin/v2/namespaces/public/default/permissions/{ANONYMOUS}", ["produce", "consume"]),
            ("/admin/v2/tenants/private", {"adminRoles": [], "allowedClusters": ["standalone"]}),
            ("/admin/v2/namespaces/private/auth", None),
            ("/admin/v2/namespaces/private/auth/permissions/token-principal", ["produce", "consume"]),
            ("/admin/v2/namespaces/private/auth/permissions/reader", ["produce", "consume"]),
        ):
            r = http.post(path, json=body) if "permissions" in path else http.put(path, json=body)
            assert r.status_code == 204, (path, r.text)
    yield s
    s.server.stop()


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """No anonymous role; ``/metrics`` needs credentials."""
    s = _start(tmp_path_factory, "strict", COMPACTOR_AUTHENTICATE_METRICS_ENDPOINT="true")
    yield s
    s.server.stop()


def private_topic() -> str:
    return f"persistent://private/auth/t-{uuid.uuid4().hex[:10]}"


def _round_trip(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    client.create_producer(topic, batching_enabled=False).send(b"hello")
    msg = consumer.receive(10_000)
    assert msg.data() == b"hello"
    consumer.acknowledge(msg)


# ------------------------------------------------------------------ REST


def test_rest_takes_a_token_and_a_password_side_by_side(anonymous_server: Secured) -> None:
    s = anonymous_server
    for headers in (basic("admin"), s.bearer(SUPERUSER), basic("legacy"), basic("reader")):
        r = httpx.get(f"{s.url}/admin/v2/namespaces/private/auth/permissions", headers=headers)
        expected = 403 if headers in (basic("legacy"), basic("reader")) else 200  # not tenant admins
        assert r.status_code == expected, (headers, r.text)
    r = httpx.get(f"{s.url}/admin/v2/namespaces/private/auth/permissions", headers=basic("admin"))
    assert r.json()["reader"] == ["consume", "produce"]
    # Each user is its role: reader may look up the private topic, legacy may not.
    topic = private_topic().removeprefix("persistent://")
    assert (
        httpx.get(f"{s.url}/lookup/v2/topic/persistent/{topic}", headers=basic("reader")).status_code == 200
    )
    r = httpx.get(f"{s.url}/lookup/v2/topic/persistent/{topic}", headers=basic("legacy"))
    assert r.status_code == 403 and "role 'legacy'" in r.json()["reason"]


@pytest.mark.parametrize(
    "headers",
    [
        basic("admin", "wrong"),
        basic("admin", "12345"),
        {"Authorization": "Basic " + base64.b64encode(b"nobody:123456").decode()},
        {"Authorization": "Basic " + base64.b64encode(b"admin").decode()},  # no password
        {"Authorization": "Basic ***"},
        {"Authorization": "Bearer not.a.token"},
    ],
)
def test_wrong_credentials_are_401_even_with_an_anonymous_role(
    anonymous_server: Secured, headers: dict[str, str]
) -> None:
    s = anonymous_server
    before = httpx.get(
        f"{s.url}/admin/v2/namespaces/public/default/permissions", headers=basic("admin")
    ).json()
    r = httpx.post(
        f"{s.url}/admin/v2/namespaces/public/default/permissions/intruder", json=["produce"], headers=headers
    )
    assert r.status_code == 401, r.text
    assert r.json()["reason"]
    assert "Basic" in r.headers["www-authenticate"] and "Bearer" in r.headers["www-authenticate"]
    after = httpx.get(
        f"{s.url}/admin/v2/namespaces/public/default/permissions", headers=basic("admin")
    ).json()
    assert after == before  # nothing changed


def test_the_wrong_password_reason_does_not_say_which_was_wrong(anonymous_server: Secured) -> None:
    s = anonymous_server
    for headers in (basic("admin", "wrong"), {"Authorization": "Basic " + base64.b64encode(b"x:y").decode()}):
        r = httpx.get(f"{s.url}/admin/v2/tenants", headers=headers)
        assert r.json()["reason"] == "Unknown user or invalid password"


def test_rest_without_credentials_is_the_anonymous_role(anonymous_server: Secured) -> None:
    s = anonymous_server
    topic = f"public/default/anon-{uuid.uuid4().hex[:8]}"
    value = base64.b64encode(b"v").decode()
    assert httpx.put(f"{s.url}/admin/v2/persistent/{topic}", headers=basic("admin")).status_code == 204
    r = httpx.post(f"{s.url}/topics/persistent/{topic}", json={"messages": [{"key": "k", "value": value}]})
    assert r.status_code == 200, r.text
    r = httpx.get(f"{s.url}/topics/persistent/{topic}/messages", params={"maxMessages": 10})
    assert r.status_code == 200 and [m["value"] for m in r.json()["messages"]] == [value]
    # A namespace it has no grant on: 403 (who it is was settled), naming the anonymous role.
    secret = private_topic().removeprefix("persistent://")
    r = httpx.post(f"{s.url}/topics/persistent/{secret}", json={"messages": [{"key": "k", "value": value}]})
    assert r.status_code == 403, r.text
    assert "role 'anonymous' is not authorized to produce to" in r.json()["reason"]
    assert httpx.get(f"{s.url}/admin/v2/tenants").status_code == 403  # not a superuser


def test_a_method_the_client_names_that_no_provider_serves_is_anonymous(anonymous_server: Secured) -> None:
    s = anonymous_server
    for headers in ({"Authorization": "Digest abc"}, {"X-Pulsar-Auth-Method-Name": "sasl"}):
        r = httpx.get(f"{s.url}/admin/v2/tenants", headers=headers)
        assert r.status_code == 403 and "role 'anonymous'" in r.json()["reason"], r.text
    # Pulsar's Java client names its method in a header beside the credentials.
    headers = {**basic("admin"), "X-Pulsar-Auth-Method-Name": "basic"}
    assert httpx.get(f"{s.url}/admin/v2/tenants", headers=headers).status_code == 200


def test_metrics_take_the_anonymous_role_as_pulsar_does(anonymous_server: Secured) -> None:
    s = anonymous_server
    assert httpx.get(f"{s.url}/metrics").status_code == 200
    assert httpx.get(f"{s.url}/metrics", headers=basic("admin", "wrong")).status_code == 401


def test_the_api_description_names_each_scheme_and_the_anonymous_alternative(
    anonymous_server: Secured,
) -> None:
    doc = httpx.get(f"{anonymous_server.url}/openapi.json").json()
    assert doc["components"]["securitySchemes"] == {
        "bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
        "basicAuth": {"type": "http", "scheme": "basic"},
    }
    op = doc["paths"]["/admin/v2/tenants"]["get"]
    assert op["security"] == [{"bearerAuth": []}, {"basicAuth": []}, {}]
    assert {"401", "403"} <= set(op["responses"])


def test_strict_server_refuses_no_credentials_and_guards_metrics(strict_server: Secured) -> None:
    s = strict_server
    r = httpx.get(f"{s.url}/admin/v2/tenants")
    assert r.status_code == 401
    reason = r.json()["reason"]
    assert "authentication required" in reason and "Bearer" in reason and "Basic" in reason
    assert httpx.get(f"{s.url}/metrics").status_code == 401
    assert httpx.get(f"{s.url}/metrics", headers=basic("admin", "nope")).status_code == 401
    assert httpx.get(f"{s.url}/metrics", headers=basic("reader")).status_code == 200  # any valid user
    assert httpx.get(f"{s.url}/metrics", headers=s.bearer("someone")).status_code == 200
    r = httpx.get(f"{s.url}/admin/v2/tenants", headers={"Authorization": "Digest abc"})
    assert r.status_code == 401
    assert r.json()["reason"] == (
        "the Authorization header must be 'Bearer <token>' or 'Basic <base64 of user:password>'"
    )
    r = httpx.get(f"{s.url}/admin/v2/tenants", headers={"X-Pulsar-Auth-Method-Name": "sasl"})
    assert r.status_code == 401
    assert (
        "No anonymous role, and no authentication provider configured for auth method 'sasl'"
        in (r.json()["reason"])
    )


# ------------------------------------------------------------------ the binary protocol


def test_the_official_client_with_basic_and_with_a_token(anonymous_server: Secured) -> None:
    s = anonymous_server
    token = jwt.encode({"sub": "token-principal"}, s.secret_key, algorithm="HS256")
    for auth, http in (
        (pulsar.AuthenticationBasic("admin", "123456"), False),
        (pulsar.AuthenticationBasic("reader", PASSWORDS["reader"]), False),
        (pulsar.AuthenticationBasic("admin", "123456", "basic"), True),  # the HTTP lookup too
        (pulsar.AuthenticationBasic(auth_params_string='{"username": "admin","password": "123456"}'), False),
        (pulsar.AuthenticationToken(token), False),
        (pulsar.AuthenticationToken(token), True),
    ):
        client = s.client(auth, http=http)
        try:
            _round_trip(client, private_topic())
        finally:
            client.close()


def test_a_method_no_provider_serves_is_the_anonymous_role_on_the_wire(anonymous_server: Secured) -> None:
    """pulsar-client-python's test_basic_auth_method: the method 'unknown' with the right
    password connects as the anonymous role, which private/auth refuses (AuthorizationError)."""
    s = anonymous_server
    for http in (False, True):
        client = s.client(pulsar.AuthenticationBasic("admin", "123456", "unknown"), http=http)
        try:
            with pytest.raises(pulsar.AuthorizationError):
                client.subscribe(private_topic(), "s")
        finally:
            client.close()


def test_anonymous_on_the_wire_uses_what_it_is_granted(anonymous_server: Secured) -> None:
    s = anonymous_server
    client = s.client()
    try:
        _round_trip(client, f"persistent://public/default/anon-{uuid.uuid4().hex[:8]}")
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(private_topic())
    finally:
        client.close()


def _connect_as(s: Secured, method: str | None, data: bytes | None) -> pb.BaseCommand:
    """The server's answer to a CONNECT with these credentials (a raw socket: exactly what it says)."""
    fields: dict[str, object] = {"client_version": "raw", "protocol_version": 21}
    if method is not None:
        fields["auth_method_name"] = method
    if data is not None:
        fields["auth_data"] = data
    with raw(s.server) as sock:
        sock.sendall(encode(command(pb.BaseCommand.CONNECT, **fields)))
        answer = read_frame(sock)
        if answer.type == pb.BaseCommand.ERROR:
            assert sock.recv(1) == b""  # and the connection is closed, as Pulsar closes it
        return answer


@pytest.mark.parametrize(
    ("method", "data", "reason"),
    [
        ("basic", b"admin:wrong", "Unknown user or invalid password"),
        ("basic", b"nobody:123456", "Unknown user or invalid password"),
        ("basic", b"admin", "user:password"),
        ("token", b"not-a-token", "token"),
        ("token", None, "no token"),
    ],
)
def test_a_wrong_password_on_the_wire_is_an_authentication_error(
    anonymous_server: Secured, method: str, data: bytes | None, reason: str
) -> None:
    answer = _connect_as(anonymous_server, method, data)
    assert answer.type == pb.BaseCommand.ERROR
    assert answer.error.error == pb.AuthenticationError
    assert answer.error.message.startswith("Unable to authenticate") and reason in answer.error.message


def test_the_official_client_with_a_wrong_password_gets_nothing(anonymous_server: Secured) -> None:
    """The C++ client closes a connection answered by anything but CONNECTED and retries until its
    operation timeout (so against Pulsar too); over the HTTP lookup the refusal is the lookup's
    401, its ConnectError (pulsar-client-python's test_invalid_basic_auth)."""
    s = anonymous_server
    topic = private_topic()
    for http in (False, True):
        client = pulsar.Client(
            s.url if http else s.server.pulsar_url,
            authentication=pulsar.AuthenticationBasic("admin", "wrong"),
            operation_timeout_seconds=2,
            logger=QUIET,
        )
        try:
            with pytest.raises(pulsar.ConnectError if http else pulsar.Timeout):
                client.create_producer(topic)
        finally:
            client.close()
    # Nothing was made under the refused credentials; the listener still serves.
    r = httpx.get(f"{s.url}/admin/v2/persistent/private/auth", headers=basic("admin"))
    assert topic not in r.json()
    client = s.client(pulsar.AuthenticationBasic("admin", "123456"))
    try:
        _round_trip(client, private_topic())
    finally:
        client.close()


def test_each_method_connects_on_the_wire_as_its_role(
    anonymous_server: Secured, strict_server: Secured
) -> None:
    assert _connect_as(anonymous_server, "basic", b"admin:123456").type == pb.BaseCommand.CONNECTED
    for method in (None, "none", "unknown", "tls"):  # tls: no provider here, and no certificate
        assert _connect_as(anonymous_server, method, b"x").type == pb.BaseCommand.CONNECTED, method
    for method in (None, "unknown"):
        answer = _connect_as(strict_server, method, b"admin:123456")
        assert answer.error.error == pb.AuthenticationError
        assert (
            "No anonymous role" in answer.error.message or "authentication required" in answer.error.message
        )


def test_strict_server_refuses_a_client_without_credentials_on_the_wire(strict_server: Secured) -> None:
    s = strict_server
    client = s.client(pulsar.AuthenticationBasic("legacy", PASSWORDS["legacy"]))
    try:
        with pytest.raises(pulsar.AuthorizationError):  # authenticated, with no grant
            client.create_producer("persistent://public/default/strict")
    finally:
        client.close()
