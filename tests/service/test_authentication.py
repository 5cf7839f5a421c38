"""The provider chain: dispatch by the method the client names, the anonymous role, the tls
provider's role from a certificate a real TLS handshake verified, and the settings that build it."""

from __future__ import annotations

import base64
import datetime
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import ValidationError

from api.app import authentication_chain
from service.authentication import (
    Authentication,
    Credentials,
    common_name,
    parse_providers,
)
from service.basic_auth import BasicAuthenticator, parse
from service.errors import Unauthenticated
from service.settings import Settings
from service.tokens import TokenVerifier, create_token

KEY = b"k" * 32
HTPASSWD = "alice:$apr1$abcdefgh$h9FWgUz3n9YxylKLlR5SQ/\n"  # alice / secret
JAVA = "org.apache.pulsar.broker.authentication.AuthenticationProvider"


def _chain(anonymous: str | None = None, *, tls: bool = True) -> Authentication:
    return Authentication(
        token=TokenVerifier(secret_key=KEY),
        basic=BasicAuthenticator(parse(HTPASSWD)),
        tls=tls,
        anonymous_role=anonymous,
    )


# ------------------------------------------------------------------ a real TLS handshake


def _name(*attributes: tuple[x509.ObjectIdentifier, str]) -> x509.Name:
    return x509.Name([x509.NameAttribute(oid, value) for oid, value in attributes])


def _certificate(
    subject: x509.Name, issuer: x509.Name, key: Any, signer: Any, *, ca: bool
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(signer, hashes.SHA256())
    )


def _pem(directory: Path, name: str, cert: x509.Certificate, key: Any) -> tuple[Path, Path]:
    cert_file, key_file = directory / f"{name}.pem", directory / f"{name}-key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


#: A client certificate's subject as a deployment's would be (the role: its CN).
HTTPS_CLIENT = x509.Name(
    [
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Acme"),
        x509.NameAttribute(NameOID.COMMON_NAME, "https-client"),
    ]
)


def peer_certificate_of(tmp_path: Path, client_subject: x509.Name) -> dict[str, Any]:
    """What ``getpeercert()`` gives the server after a handshake in which a client presented a
    certificate with ``client_subject``, issued by the CA the server trusts (the handshake runs
    in memory: two ``SSLObject``s over ``MemoryBIO``s, no socket)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name((NameOID.COMMON_NAME, "test-ca"))
    ca_cert = _certificate(ca_name, ca_name, ca_key, ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _certificate(_name((NameOID.COMMON_NAME, "broker")), ca_name, server_key, ca_key, ca=False)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = _certificate(client_subject, ca_name, client_key, ca_key, ca=False)
    ca_file, _ = _pem(tmp_path, "ca", ca_cert, ca_key)
    server_files = _pem(tmp_path, "server", server_cert, server_key)
    client_files = _pem(tmp_path, "client", client_cert, client_key)

    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(*server_files)
    server_ctx.load_verify_locations(ca_file)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(ca_file)
    client_ctx.check_hostname = False
    client_ctx.load_cert_chain(*client_files)

    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_side=False)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {client: False, server: False}
    for _ in range(10):
        for side in (client, server):
            if not done[side]:
                try:
                    side.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            break
    assert all(done.values()), "the handshake did not complete"
    cert = server.getpeercert()
    assert cert
    return cert


def test_the_tls_role_is_the_common_name_of_the_verified_certificate(tmp_path: Path) -> None:
    cert = peer_certificate_of(
        tmp_path,
        _name(
            (NameOID.COUNTRY_NAME, "GB"), (NameOID.ORGANIZATION_NAME, "Acme"), (NameOID.COMMON_NAME, "app1")
        ),
    )
    chain = _chain()
    assert chain.role(Credentials(method="tls", peer_certificate=cert)) == "app1"
    # Whatever data the client sends beside it (the C++ client sends none).
    assert chain.role(Credentials(method="tls", data="ignored", peer_certificate=cert)) == "app1"


def test_the_first_common_name_in_pulsars_rfc_2253_order(tmp_path: Path) -> None:
    """Two CNs: Pulsar takes the first of ``CN=leaf,OU=x,CN=outer``, the name's last RDN."""
    cert = peer_certificate_of(
        tmp_path,
        _name(
            (NameOID.COMMON_NAME, "outer"),
            (NameOID.ORGANIZATIONAL_UNIT_NAME, "x"),
            (NameOID.COMMON_NAME, "leaf"),
        ),
    )
    assert common_name(cert) == "leaf"


def test_a_certificate_without_a_common_name_is_refused(tmp_path: Path) -> None:
    cert = peer_certificate_of(tmp_path, _name((NameOID.ORGANIZATION_NAME, "Acme")))
    with pytest.raises(Unauthenticated, match="Client unable to authenticate with TLS certificate"):
        _chain().role(Credentials(method="tls", peer_certificate=cert))


@pytest.mark.parametrize("cert", [None, {}])  # {}: getpeercert() of a certificate not verified
def test_tls_without_a_verified_certificate_is_refused(cert: dict[str, Any] | None) -> None:
    with pytest.raises(Unauthenticated, match="Failed to get TLS certificates from client"):
        _chain(anonymous="anonymous").role(Credentials(method="tls", peer_certificate=cert))


# ------------------------------------------------------------------ dispatch


def test_each_method_goes_to_its_provider() -> None:
    chain = _chain()
    assert chain.methods == ("token", "basic", "tls")
    assert chain.role(Credentials("token", create_token(subject="app2", secret_key=KEY))) == "app2"
    assert chain.role(Credentials("basic", "alice:secret")) == "alice"
    # A token is not a password and the reverse: each provider checks only its own method's data.
    with pytest.raises(Unauthenticated):
        chain.role(Credentials("basic", create_token(subject="app2", secret_key=KEY)))
    with pytest.raises(Unauthenticated):
        chain.role(Credentials("token", "alice:secret"))


def test_a_failed_check_is_refused_even_with_an_anonymous_role() -> None:
    chain = _chain(anonymous="anonymous")
    with pytest.raises(Unauthenticated, match="Unknown user or invalid password"):
        chain.role(Credentials("basic", "alice:wrong"))
    with pytest.raises(Unauthenticated, match="token"):
        chain.role(Credentials("token", "not-a-token"))


def test_no_credentials_or_a_method_no_provider_serves_is_the_anonymous_role() -> None:
    chain = _chain(anonymous="anonymous", tls=False)
    for method in ("none", "unknown", "tls", "sasl"):
        assert chain.role(Credentials(method, "whatever")) == "anonymous", method


def test_without_an_anonymous_role_they_are_refused_with_pulsars_reason() -> None:
    chain = _chain(tls=False)
    with pytest.raises(Unauthenticated, match="authentication required"):
        chain.role(Credentials())
    with pytest.raises(
        Unauthenticated,
        match="No anonymous role, and no authentication provider configured for auth method 'unknown'",
    ):
        chain.role(Credentials("unknown", "admin:123456"))


def test_credentials_never_show_their_data() -> None:
    assert "secret" not in repr(Credentials("basic", "alice:secret"))


# ------------------------------------------------------------------ settings


def test_provider_names_as_pulsars_broker_conf_gives_them() -> None:
    assert parse_providers("token") == ("token",)
    assert parse_providers(f"{JAVA}Tls,{JAVA}Token, {JAVA}Basic") == ("tls", "token", "basic")
    assert parse_providers(" basic ,, BASIC,tls") == ("basic", "tls")
    with pytest.raises(ValueError, match="unknown authentication provider 'kerberos'"):
        parse_providers("token,kerberos")


def _settings(tmp_path: Path, **fields: Any) -> Settings:
    base: dict[str, Any] = {
        "data_dir": tmp_path,
        "authentication_enabled": True,
        "token_secret_key": "data:;base64," + base64.b64encode(KEY).decode(),
    }
    return Settings(**{**base, **fields})


def test_settings_build_the_chain(tmp_path: Path) -> None:
    assert _settings(tmp_path).authentication_providers == ("token",)  # today's default
    conf = tmp_path / "htpasswd"
    conf.write_text(HTPASSWD)
    s = _settings(
        tmp_path,
        authentication_providers=f"{JAVA}Token,{JAVA}Basic,tls",
        basic_auth_conf=str(conf),
        anonymous_user_role=" anonymous ",
    )
    chain = authentication_chain(s)
    assert chain is not None and chain.methods == ("token", "basic", "tls")
    assert chain.role(Credentials("basic", "alice:secret")) == "alice"
    assert chain.role(Credentials()) == "anonymous"
    assert authentication_chain(_settings(tmp_path, authentication_enabled=False)) is None


def test_settings_errors_at_startup(tmp_path: Path) -> None:
    cases: dict[str, dict[str, Any]] = {
        "unknown authentication provider 'oauth2'": {"authentication_providers": "token,oauth2"},
        "needs at least one": {"authentication_providers": " , "},
        "the basic provider needs COMPACTOR_BASIC_AUTH_CONF": {"authentication_providers": "basic"},
        "is no file that exists": {
            "authentication_providers": "basic",
            "basic_auth_conf": str(tmp_path / "missing"),
        },
        "line 1 of the basic auth conf is not user:hash": {
            "authentication_providers": "basic",
            "basic_auth_conf": "data:,just-a-name",
        },
        "COMPACTOR_TOKEN_SECRET_KEY or COMPACTOR_TOKEN_PUBLIC_KEY for the token provider": {
            "token_secret_key": None,
            "authentication_providers": "token,tls",
        },
    }
    for reason, fields in cases.items():
        with pytest.raises(ValidationError, match=reason):
            _settings(tmp_path, **fields)
    # The basic and tls providers alone need no token key.
    s = _settings(tmp_path, token_secret_key=None, authentication_providers="tls")
    assert s.authentication_providers == ("tls",)


def test_an_unbounded_anonymous_role_is_refused_off_loopback(tmp_path: Path) -> None:
    def refusal(**fields: Any) -> str | None:
        return _settings(tmp_path, host="0.0.0.0", **fields).exposure_refusal()

    assert refusal() is None
    assert refusal(anonymous_user_role="anonymous", authorization_enabled=True) is None
    unbounded = refusal(anonymous_user_role="anonymous")
    assert unbounded is not None and "anonymous role 'anonymous' unbounded" in unbounded
    superuser = refusal(anonymous_user_role="anon", authorization_enabled=True, superuser_roles="anon,admin")
    assert superuser is not None and "COMPACTOR_AUTHORIZATION_ENABLED=true" in superuser
    assert refusal(anonymous_user_role="anonymous", allow_unauthenticated=True) is None
    assert _settings(tmp_path, anonymous_user_role="anonymous").exposure_refusal() is None  # loopback
