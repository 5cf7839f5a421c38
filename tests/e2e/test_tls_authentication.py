"""The tls authentication provider end to end: a client certificate's common name is the role,
over ``pulsar+ssl://`` and over HTTPS, and authorization judges it like any role.

One server with both TLS ports, the tls and token providers, authorization on, and a namespace
granted to ``app1`` (the common name of ``tls_files``' client certificate)."""

from __future__ import annotations

import base64
import ssl
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import jwt
import pulsar
import pytest

from service.tokens import create_secret_key
from tests.certificates import TlsFiles
from tests.conftest import Server

pytestmark = [pytest.mark.e2e]

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
ROLE = "app1"  # the client certificate's CN


@dataclass(frozen=True)
class Deployment:
    server: Server
    files: TlsFiles
    broker_tls: str
    web_tls: str
    granted: str  # tenant/namespace the certificate's role may produce to and consume from
    other: str  # one it may not
    admin: dict[str, str]  # a superuser's headers

    def client(self, *, cert: bool = True) -> pulsar.Client:
        auth = (
            pulsar.AuthenticationTLS(str(self.files.client_cert), str(self.files.client_key))
            if cert
            else None
        )
        return pulsar.Client(
            self.broker_tls,
            tls_trust_certs_file_path=str(self.files.ca),
            authentication=auth,
            operation_timeout_seconds=5,
            connection_timeout_ms=3000,
            logger=QUIET,
        )

    def https(self, cert: tuple[str, str] | None) -> httpx.Client:
        context = ssl.create_default_context(cafile=str(self.files.ca))
        if cert is not None:
            context.load_cert_chain(*cert)
        return httpx.Client(base_url=self.web_tls, verify=context, timeout=30)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, tls_files: TlsFiles) -> Iterator[Deployment]:
    key = create_secret_key()
    server = Server(
        tmp_path_factory.mktemp("tls-auth") / "data",
        env={
            "COMPACTOR_TLS_CERT_FILE": str(tls_files.server_cert),
            "COMPACTOR_TLS_KEY_FILE": str(tls_files.server_key),
            "COMPACTOR_TLS_TRUST_CERTS_FILE_PATH": str(tls_files.ca),
            "COMPACTOR_BROKER_SERVICE_PORT_TLS": "0",
            "COMPACTOR_WEB_SERVICE_PORT_TLS": "0",
            "COMPACTOR_AUTHENTICATION_ENABLED": "true",
            "COMPACTOR_AUTHENTICATION_PROVIDERS": "tls,token",
            "COMPACTOR_AUTHORIZATION_ENABLED": "true",
            "COMPACTOR_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(key).decode(),
            "COMPACTOR_SUPERUSER_ROLES": "admin",
        },
    )
    server.start()
    admin = {"Authorization": "Bearer " + jwt.encode({"sub": "admin"}, key, algorithm="HS256")}
    health = httpx.get(f"{server.url}/health", timeout=10).json()
    suffix = uuid.uuid4().hex[:6]
    granted, other = f"certs{suffix}/granted", f"certs{suffix}/other"
    with httpx.Client(base_url=server.url, headers=admin, timeout=30) as http:
        assert http.put(
            f"/admin/v2/tenants/certs{suffix}", json={"adminRoles": [], "allowedClusters": []}
        ).is_success
        for ns in (granted, other):
            assert http.put(f"/admin/v2/namespaces/{ns}").is_success
        r = http.post(f"/admin/v2/namespaces/{granted}/permissions/{ROLE}", json=["produce", "consume"])
        assert r.is_success, r.text
    urls = health["brokerServiceUrlTls"], health["webServiceUrlTls"]
    yield Deployment(server, tls_files, *urls, granted, other, admin)
    server.stop()


def test_a_client_certificate_is_its_common_names_role_on_the_wire(deployment: Deployment) -> None:
    client = deployment.client()
    try:
        topic = f"persistent://{deployment.granted}/t-{uuid.uuid4().hex[:8]}"
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        client.create_producer(topic).send(b"by certificate")
        assert consumer.receive(10_000).data() == b"by certificate"
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(f"persistent://{deployment.other}/t-{uuid.uuid4().hex[:8]}")
    finally:
        client.close()


def test_without_a_certificate_the_tls_port_gives_no_role(deployment: Deployment) -> None:
    # TLS itself is fine (the CA is trusted), but nothing names a role: no anonymous role here.
    client = deployment.client(cert=False)
    try:
        with pytest.raises(pulsar.PulsarException):
            client.create_producer(f"persistent://{deployment.granted}/t-{uuid.uuid4().hex[:8]}")
    finally:
        client.close()


def test_a_client_certificate_is_its_common_names_role_over_https(deployment: Deployment) -> None:
    files = deployment.files
    topic = f"t-{uuid.uuid4().hex[:8]}"
    value = base64.b64encode(b"v").decode()
    body = {"messages": [{"key": "k", "value": value}]}
    for ns in (deployment.granted, deployment.other):
        r = httpx.put(f"{deployment.server.url}/admin/v2/persistent/{ns}/{topic}", headers=deployment.admin)
        assert r.status_code == 204, r.text
    with deployment.https((str(files.client_cert), str(files.client_key))) as http:
        r = http.post(f"/topics/persistent/{deployment.granted}/{topic}", json=body)
        assert r.status_code == 200, r.text
        r = http.get(f"/topics/persistent/{deployment.granted}/{topic}/messages", params={"maxMessages": 10})
        assert r.status_code == 200 and [m["value"] for m in r.json()["messages"]] == [value]
        refused = http.post(f"/topics/persistent/{deployment.other}/{topic}", json=body)
        assert refused.status_code == 403, refused.text
        assert f"role '{ROLE}'" in refused.json()["reason"]
    with deployment.https(None) as http:  # no certificate, no token: nobody
        r = http.get(f"/topics/persistent/{deployment.granted}/{topic}/messages")
        assert r.status_code == 401, r.text
