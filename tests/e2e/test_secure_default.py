"""Without authentication, ``compactor serve`` listens on loopback only, unless told otherwise;
with TLS it serves HTTPS, which the client reaches trusting the server's certificate."""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from api.client import AuthenticationToken, Client, TransportError
from tests.conftest import Server

pytestmark = pytest.mark.e2e


def _serve(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = shutil.which("compactor", path=str(Path(sys.executable).parent)) or "compactor"
    return subprocess.run(
        [script, "serve"],
        env={**os.environ, "COMPACTOR_DATA_DIR": str(tmp_path / "data"), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_refuses_to_serve_a_network_without_authentication(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "192.0.2.1"):
        done = _serve(tmp_path, COMPACTOR_HOST=host)
        assert done.returncode == 2, done.stderr
        assert f"refusing to serve on {host} without authentication" in done.stderr
        assert "COMPACTOR_AUTHENTICATION_ENABLED=true" in done.stderr
        assert "COMPACTOR_ALLOW_UNAUTHENTICATED=true" in done.stderr
    assert not (tmp_path / "data").exists()  # refused before touching anything


def test_a_busy_broker_port_is_refused_in_one_line(tmp_path: Path) -> None:
    """Another broker (a Pulsar standalone) on the binary protocol's port: one line that says
    what to do, before anything is touched, and no traceback."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _serve(tmp_path, COMPACTOR_BROKER_SERVICE_PORT=str(port), COMPACTOR_PORT="0")
    assert done.returncode == 2, done.stderr
    assert f"cannot listen for Pulsar's binary protocol on 127.0.0.1:{port}" in done.stderr
    assert "COMPACTOR_BROKER_SERVICE_PORT" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "data").exists()


def test_serves_every_address_when_told_or_when_authenticating(
    server_factory: type[Server], tmp_path: Path
) -> None:
    # 0.0.0.0 includes loopback, where the test reaches it.
    told = server_factory(
        tmp_path / "told", env={"COMPACTOR_HOST": "0.0.0.0", "COMPACTOR_ALLOW_UNAUTHENTICATED": "true"}
    )
    told.start()
    told.kill()
    secured = server_factory(
        tmp_path / "secured",
        env={
            "COMPACTOR_HOST": "0.0.0.0",
            "COMPACTOR_AUTHENTICATION_ENABLED": "true",
            "COMPACTOR_TOKEN_SECRET_KEY": "data:;base64,c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA==",
        },
    )
    secured.start()


def test_invalid_security_settings_are_refused_with_a_reason(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from service.settings import Settings

    cases = {
        "authentication needs COMPACTOR_TOKEN_SECRET_KEY": {"authentication_enabled": True},
        "authorization needs authentication": {"authorization_enabled": True},
        "cannot read key file": {
            "authentication_enabled": True,
            "token_secret_key": f"file://{tmp_path}/missing.key",
        },
        "not valid base64": {"authentication_enabled": True, "token_secret_key": "data:;base64,***"},
        "TLS needs both": {"tls_cert_file": tmp_path},
    }
    for reason, fields in cases.items():
        with pytest.raises(ValidationError, match=reason):
            Settings(data_dir=tmp_path, **fields)
    assert Settings(data_dir=tmp_path, superuser_roles=" a, b ,,").superuser_roles == {"a", "b"}
    # As serve shows it: a usage error, not a trace.
    done = _serve(tmp_path, COMPACTOR_AUTHORIZATION_ENABLED="true")
    assert done.returncode == 2 and "authorization needs authentication" in done.stderr
    assert "Traceback" not in done.stderr


def _self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


def test_https_with_a_self_signed_certificate_and_a_token(
    server_factory: type[Server], tmp_path: Path
) -> None:
    import jwt

    cert, key = _self_signed(tmp_path / "tls")
    secret = b"s" * 32
    server = server_factory(
        tmp_path / "data",
        env={
            "COMPACTOR_TLS_CERT_FILE": str(cert),
            "COMPACTOR_TLS_KEY_FILE": str(key),
            "COMPACTOR_AUTHENTICATION_ENABLED": "true",
            "COMPACTOR_TOKEN_SECRET_KEY": "data:;base64,c3Nzc3Nzc3Nzc3Nzc3Nzc3Nzc3Nzc3Nzc3Nzc3Nzc3M=",
        },
    )
    server.start()
    assert server.url.startswith("https://")
    auth = AuthenticationToken(jwt.encode({"sub": "app"}, secret, algorithm="HS256"))
    with Client(server.url, authentication=auth, tls_trust_certs_file_path=str(cert)) as c:
        c.admin.topics.create("public/default/secure")
        ids = c.create_producer("public/default/secure").send_many([b"a", b"b"])
        reader = c.create_reader("public/default/secure", "earliest")
        assert [reader.read_next(5000).value() for _ in ids] == [b"a", b"b"]
    # Without trusting the certificate, the client refuses the server.
    with (
        Client(server.url, authentication=auth) as c,
        pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        c.admin.topics.list("public/default")
    # Plain HTTP to the TLS port is no answer either.
    with Client(server.url.replace("https", "http"), authentication=auth) as c, pytest.raises(TransportError):
        c.admin.topics.list("public/default")
