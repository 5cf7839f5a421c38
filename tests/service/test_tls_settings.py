"""The TLS settings (Pulsar's brokerServicePortTls, webServicePortTls, tlsTrustCertsFilePath,
tlsRequireTrustedClientCertOnConnect, tlsProtocols, tlsCiphers): what they serve, and the
settings that cannot serve refused at start with the setting at fault."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from api.main import app
from service.settings import Settings
from service.tls import server_context
from tests.certificates import TlsFiles


def _tls(files: TlsFiles, tmp_path: Path, **more: object) -> Settings:
    return Settings(
        data_dir=tmp_path,
        tls_cert_file=files.server_cert,
        tls_key_file=files.server_key,
        **more,
    )


def test_the_tls_ports_and_their_urls(tls_files: TlsFiles, tmp_path: Path) -> None:
    s = _tls(tls_files, tmp_path, port=8081, broker_service_port_tls=6651, web_service_port_tls=8443)
    assert s.broker_service_url == "pulsar://127.0.0.1:6650"
    assert s.broker_service_url_tls == "pulsar+ssl://127.0.0.1:6651"
    # HTTPS on its own port: the plain port stays HTTP.
    assert s.advertised_url == "http://127.0.0.1:8081"
    assert s.web_service_url_tls == "https://127.0.0.1:8443"


def test_a_certificate_alone_makes_the_one_port_https(tls_files: TlsFiles, tmp_path: Path) -> None:
    s = _tls(tls_files, tmp_path, port=8443)
    assert s.advertised_url == s.web_service_url_tls == "https://127.0.0.1:8443"
    assert s.broker_service_url_tls is None  # no TLS for the binary protocol unless its port is set
    assert Settings(data_dir=tmp_path).web_service_url_tls is None


def test_a_listener_may_have_a_pulsar_ssl_url_once_the_tls_port_is_on(
    tls_files: TlsFiles, tmp_path: Path
) -> None:
    listeners = "a:pulsar://h:6650,a:pulsar+ssl://h:6651"
    s = _tls(tls_files, tmp_path, broker_service_port_tls=6651, advertised_listeners=listeners)
    assert s.broker_service_url_tls == "pulsar+ssl://h:6651"


def test_client_certificates_are_asked_for_or_required(tls_files: TlsFiles, tmp_path: Path) -> None:
    assert server_context(_tls(tls_files, tmp_path)).verify_mode == ssl.CERT_NONE
    asked = _tls(tls_files, tmp_path, tls_trust_certs_file_path=tls_files.ca)
    assert server_context(asked).verify_mode == ssl.CERT_OPTIONAL
    required = _tls(
        tls_files,
        tmp_path,
        tls_trust_certs_file_path=tls_files.ca,
        tls_require_trusted_client_cert_on_connect=True,
    )
    assert server_context(required).verify_mode == ssl.CERT_REQUIRED


def test_protocols_and_ciphers(tls_files: TlsFiles, tmp_path: Path) -> None:
    s = _tls(tls_files, tmp_path, tls_protocols="TLSv1.3", tls_ciphers="ECDHE-ECDSA-AES256-GCM-SHA384")
    context = server_context(s)
    assert context.minimum_version == context.maximum_version == ssl.TLSVersion.TLSv1_3
    twelve = {c["name"] for c in context.get_ciphers() if c["protocol"] == "TLSv1.2"}
    assert twelve == {"ECDHE-ECDSA-AES256-GCM-SHA384"}


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        (
            {"broker_service_port_tls": 6651},
            "COMPACTOR_BROKER_SERVICE_PORT_TLS serves TLS, which needs a cert",
        ),
        ({"web_service_port_tls": 0}, "COMPACTOR_WEB_SERVICE_PORT_TLS serves TLS, which needs a cert"),
        ({"tls_require_trusted_client_cert_on_connect": True}, "set COMPACTOR_TLS_TRUST_CERTS_FILE_PATH"),
        ({"advertised_listeners": "a:pulsar://h:6650,a:pulsar+ssl://h:6651"}, "not served over TLS"),
    ],
)
def test_tls_settings_that_cannot_serve_are_refused(tmp_path: Path, settings: dict, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        Settings(data_dir=tmp_path, **settings)


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        (
            {"broker_service_port_tls": 6650},
            "COMPACTOR_BROKER_SERVICE_PORT and COMPACTOR_BROKER_SERVICE_PORT_TLS",
        ),
        ({"port": 8443, "web_service_port_tls": 8443}, "COMPACTOR_PORT and COMPACTOR_WEB_SERVICE_PORT_TLS"),
        ({"tls_protocols": "TLSv1.2,TLSv1"}, "TLSv1 not accepted"),
        ({"tls_ciphers": "NO-SUCH-CIPHER"}, "not usable"),
        ({"tls_trust_certs_file_path": "/nonexistent/ca.pem"}, "does not exist"),
    ],
)
def test_bad_tls_settings_are_refused(
    tls_files: TlsFiles, tmp_path: Path, settings: dict, reason: str
) -> None:
    with pytest.raises(ValidationError, match=reason):
        _tls(tls_files, tmp_path, **settings)


def test_a_key_that_is_not_the_certificates_is_refused(tls_files: TlsFiles, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="not usable"):
        Settings(data_dir=tmp_path, tls_cert_file=tls_files.server_cert, tls_key_file=tls_files.client_key)


def test_serve_stops_on_a_tls_port_without_a_certificate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("COMPACTOR_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("COMPACTOR_BROKER_SERVICE_PORT_TLS", "6651")
    result = CliRunner().invoke(app, ["serve"])
    assert result.exit_code == 2
    said = " ".join(result.output.replace("│", " ").split())  # unwrapped from typer's box
    assert "COMPACTOR_BROKER_SERVICE_PORT_TLS serves TLS, which needs a certificate" in said
