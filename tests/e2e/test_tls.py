"""TLS on both ports, judged by the official ``pulsar-client``, httpx and the CLI: the binary
protocol on ``COMPACTOR_BROKER_SERVICE_PORT_TLS`` (``pulsar+ssl://``) and HTTPS on
``COMPACTOR_WEB_SERVICE_PORT_TLS``, beside the plain ports, with a throw-away CA
(``tests.certificates``); client certificates asked for and checked, or required.

Both TLS ports are given as 0 (any free port): the tests find them in ``/health``, as the
lookups' answers must give them."""

from __future__ import annotations

import socket
import ssl
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pulsar
import pytest
from typer.testing import CliRunner

from api.main import app as cli_app
from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import command, encode
from tests.certificates import TlsFiles
from tests.conftest import Server
from tests.e2e.raw_wire import connect, read_frame

pytestmark = [pytest.mark.e2e]

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


@dataclass(frozen=True)
class TlsServer:
    """A running server with both TLS ports, and where they listen."""

    server: Server
    files: TlsFiles
    broker_tls: str  # pulsar+ssl://127.0.0.1:port
    web_tls: str  # https://127.0.0.1:port

    @property
    def broker_tls_port(self) -> int:
        return int(urlsplit(self.broker_tls).port or 0)

    def https(self) -> httpx.Client:
        """An HTTPS client of the TLS port, trusting the CA, without a client certificate."""
        return httpx.Client(base_url=self.web_tls, verify=_trusting(self.files), timeout=30)


def _trusting(files: TlsFiles, *, cert: tuple[str, str] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(files.ca))
    if cert is not None:
        context.load_cert_chain(*cert)
    return context


def _start(data_dir: Path, files: TlsFiles, **env: str) -> TlsServer:
    server = Server(
        data_dir,
        env={
            "COMPACTOR_TLS_CERT_FILE": str(files.server_cert),
            "COMPACTOR_TLS_KEY_FILE": str(files.server_key),
            "COMPACTOR_TLS_TRUST_CERTS_FILE_PATH": str(files.ca),
            "COMPACTOR_BROKER_SERVICE_PORT_TLS": "0",
            "COMPACTOR_WEB_SERVICE_PORT_TLS": "0",
            **env,
        },
    )
    server.start()
    health = httpx.get(f"{server.url}/health", timeout=10).json()
    return TlsServer(server, files, health["brokerServiceUrlTls"], health["webServiceUrlTls"])


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, tls_files: TlsFiles) -> Iterator[TlsServer]:
    """Client certificates asked for and checked if sent, not required."""
    s = _start(tmp_path_factory.mktemp("tls") / "data", tls_files)
    yield s
    s.server.stop()


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory, tls_files: TlsFiles) -> Iterator[TlsServer]:
    """A trusted client certificate required on connect."""
    s = _start(
        tmp_path_factory.mktemp("tls-strict") / "data",
        tls_files,
        COMPACTOR_TLS_REQUIRE_TRUSTED_CLIENT_CERT_ON_CONNECT="true",
    )
    yield s
    s.server.stop()


def fresh() -> str:
    return f"persistent://public/default/tls-{uuid.uuid4().hex[:10]}"


def _round_trip(client: pulsar.Client, n: int = 5) -> None:
    """Produce ``n`` messages and consume them on a new subscription."""
    topic = fresh()
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    sent = [f"m{i}".encode() for i in range(n)]
    for value in sent:
        producer.send(value, partition_key="k")
    got = [consumer.receive(10_000) for _ in range(n)]
    for m in got:
        consumer.acknowledge(m)
    assert [m.data() for m in got] == sent


def _client(url: str, files: TlsFiles, **kwargs: object) -> pulsar.Client:
    return pulsar.Client(
        url,
        tls_trust_certs_file_path=str(files.ca),
        logger=QUIET,
        # Short: the refusals' tests wait this long for the client to give up.
        operation_timeout_seconds=3,
        connection_timeout_ms=3000,
        **kwargs,
    )


def _refused(url: str, files: TlsFiles, **kwargs: object) -> None:
    client = _client(url, files, **kwargs)
    try:
        with pytest.raises(pulsar.PulsarException):
            client.create_producer(fresh())
    finally:
        client.close()


# ------------------------------------------------------------------ the official client


def test_health_says_where_the_tls_ports_listen(tls_server: TlsServer) -> None:
    assert tls_server.broker_tls.startswith("pulsar+ssl://127.0.0.1:")
    assert tls_server.web_tls.startswith("https://127.0.0.1:")
    ports = {urlsplit(tls_server.broker_tls).port, urlsplit(tls_server.web_tls).port}
    # Port 0 became real ports, neither of them a plain one.
    assert 0 not in ports and not ports & {tls_server.server.port, tls_server.server.broker_port}


@pytest.mark.parametrize("validate_hostname", [False, True])
def test_pulsar_ssl_produces_and_consumes(tls_server: TlsServer, validate_hostname: bool) -> None:
    client = _client(tls_server.broker_tls, tls_server.files, tls_validate_hostname=validate_hostname)
    try:
        _round_trip(client)
    finally:
        client.close()


def test_an_https_service_url_looks_up_over_https_and_stays_on_tls(tls_server: TlsServer) -> None:
    # The client asks the HTTPS lookup, then connects to the brokerUrlTls it answers.
    client = _client(tls_server.web_tls, tls_server.files, tls_validate_hostname=True)
    try:
        _round_trip(client)
    finally:
        client.close()


def test_a_client_that_trusts_another_ca_is_refused(tls_server: TlsServer) -> None:
    # The server's certificate is not one the client trusts: no connection, no message.
    client = pulsar.Client(
        tls_server.broker_tls,
        tls_trust_certs_file_path=str(tls_server.files.other_ca),
        logger=QUIET,
        operation_timeout_seconds=3,
    )
    try:
        with pytest.raises(pulsar.PulsarException):
            client.create_producer(fresh())
    finally:
        client.close()


def test_a_trusted_client_certificate_is_accepted_where_it_is_optional(tls_server: TlsServer) -> None:
    files = tls_server.files
    auth = pulsar.AuthenticationTLS(str(files.client_cert), str(files.client_key))
    client = _client(tls_server.broker_tls, files, authentication=auth)
    try:
        _round_trip(client)
    finally:
        client.close()


def test_a_client_certificate_of_another_ca_is_refused(tls_server: TlsServer) -> None:
    files = tls_server.files
    auth = pulsar.AuthenticationTLS(str(files.stranger_cert), str(files.stranger_key))
    _refused(tls_server.broker_tls, files, authentication=auth)
    context = _trusting(files, cert=(str(files.stranger_cert), str(files.stranger_key)))
    with pytest.raises(httpx.HTTPError), httpx.Client(verify=context, timeout=10) as http:
        http.get(f"{tls_server.web_tls}/health")
    # The listeners serve on.
    _test_still_serving(tls_server)


def _test_still_serving(s: TlsServer) -> None:
    client = _client(s.broker_tls, s.files)
    try:
        _round_trip(client, n=1)
    finally:
        client.close()
    with s.https() as http:
        assert http.get("/health").status_code == 200


# ------------------------------------------------------------------ lookups answer the TLS URLs


def test_the_binary_lookup_answers_both_urls(tls_server: TlsServer) -> None:
    topic = fresh()
    # On the plain port, and on the TLS port: both URLs, each client takes its own.
    plain = socket.create_connection(("127.0.0.1", tls_server.server.broker_port), timeout=10)
    context = _trusting(tls_server.files)
    secure = context.wrap_socket(
        socket.create_connection(("127.0.0.1", tls_server.broker_tls_port), timeout=10),
        server_hostname="127.0.0.1",
    )
    for s in (plain, secure):
        with s:
            connect(s)
            s.sendall(encode(command(pb.BaseCommand.LOOKUP, topic=topic, request_id=1)))
            answer = read_frame(s).lookupTopicResponse
            assert answer.response == pb.CommandLookupTopicResponse.Connect
            assert answer.brokerServiceUrl == tls_server.server.pulsar_url
            assert answer.brokerServiceUrlTls == tls_server.broker_tls


@pytest.mark.parametrize("https", [False, True])
def test_the_http_lookup_answers_the_tls_urls(tls_server: TlsServer, https: bool) -> None:
    path = f"/lookup/v2/topic/{fresh().replace('://', '/')}"
    if https:
        with tls_server.https() as http:
            r = http.get(path)
    else:
        r = httpx.get(f"{tls_server.server.url}{path}", timeout=10)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["brokerUrl"] == tls_server.server.pulsar_url
    assert data["brokerUrlTls"] == tls_server.broker_tls
    assert data["httpUrl"] == tls_server.server.url
    assert data["httpUrlTls"] == tls_server.web_tls


# ------------------------------------------------------------------ REST over HTTPS, and the CLI


def test_the_rest_api_over_https_and_http_is_one_service(tls_server: TlsServer) -> None:
    topic = fresh().removeprefix("persistent://")
    with tls_server.https() as http:
        assert http.put(f"/admin/v2/persistent/{topic}").status_code == 204
        r = http.post(f"/topics/persistent/{topic}", json={"messages": [{"key": "k", "value": "djE="}]})
        assert r.status_code == 200, r.text
        ids = r.json()["messageIds"]
    # Written over HTTPS, read over plain HTTP: one app, one state.
    r = httpx.get(f"{tls_server.server.url}/topics/persistent/{topic}/messages", params={"maxMessages": 10})
    assert [m["messageId"] for m in r.json()["messages"]] == ids
    # An HTTPS client that does not trust the CA gets no answer.
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{tls_server.web_tls}/health", timeout=10)


def test_the_cli_over_https(tls_server: TlsServer) -> None:
    topic = fresh().removeprefix("persistent://")
    base = ["topics", "--url", tls_server.web_tls, "--tls-trust-certs-file-path", str(tls_server.files.ca)]
    for args in (["create", topic], ["produce", topic, "-k", "a", "-m", "v1"]):
        result = CliRunner().invoke(cli_app, [*base, *args])
        assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli_app, [*base, "list", "public/default"])
    assert result.exit_code == 0, result.output
    assert f"persistent://{topic}" in result.stdout.splitlines()
    # Without the CA, the CLI refuses the server's certificate, in one line.
    result = CliRunner().invoke(cli_app, ["topics", "--url", tls_server.web_tls, "list", "public/default"])
    assert result.exit_code != 0


# ------------------------------------------------------------------ the wrong protocol on a port


def test_plain_tcp_on_the_tls_port_and_tls_on_the_plain_port_fail_cleanly(tls_server: TlsServer) -> None:
    hello = encode(command(pb.BaseCommand.CONNECT, client_version="raw", protocol_version=21))
    with socket.create_connection(("127.0.0.1", tls_server.broker_tls_port), timeout=10) as s:
        s.sendall(hello)  # not a TLS record: the handshake fails and the socket closes
        assert _read_until_closed(s) == b""
    context = _trusting(tls_server.files)
    plain = ("127.0.0.1", tls_server.server.broker_port)
    with socket.create_connection(plain, timeout=10) as s, pytest.raises((ssl.SSLError, ConnectionError)):
        context.wrap_socket(s, server_hostname="127.0.0.1")
    # The official client given the wrong scheme for a port fails too.
    _refused(f"pulsar+ssl://127.0.0.1:{tls_server.server.broker_port}", tls_server.files)
    _refused(f"pulsar://127.0.0.1:{tls_server.broker_tls_port}", tls_server.files)
    _test_still_serving(tls_server)


def _read_until_closed(s: socket.socket) -> bytes:
    """What the server sends that is not a TLS alert, until it closes (b'' when nothing)."""
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
    except ConnectionResetError:
        pass
    # A TLS alert record (content type 21) may precede the close: it is not a Pulsar frame.
    return b"" if got[:1] in (b"", b"\x15") else got


# ------------------------------------------------------------------ a client certificate required


def test_a_required_client_certificate_missing_is_refused(strict_server: TlsServer) -> None:
    files = strict_server.files
    _refused(strict_server.broker_tls, files)
    with pytest.raises(httpx.HTTPError), strict_server.https() as http:
        http.get("/health")
    # With a trusted certificate: served, on both ports.
    auth = pulsar.AuthenticationTLS(str(files.client_cert), str(files.client_key))
    client = _client(strict_server.broker_tls, files, authentication=auth)
    try:
        _round_trip(client)
    finally:
        client.close()
    cert = (str(files.client_cert), str(files.client_key))
    with httpx.Client(verify=_trusting(files, cert=cert), timeout=10) as http:
        assert http.get(f"{strict_server.web_tls}/health").status_code == 200


def test_a_required_client_certificate_of_another_ca_is_refused(strict_server: TlsServer) -> None:
    files = strict_server.files
    auth = pulsar.AuthenticationTLS(str(files.stranger_cert), str(files.stranger_key))
    _refused(strict_server.broker_tls, files, authentication=auth)
    # The plain ports are not TLS: they serve as before.
    client = pulsar.Client(strict_server.server.pulsar_url, logger=QUIET)
    try:
        _round_trip(client, n=1)
    finally:
        client.close()
