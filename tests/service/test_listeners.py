"""COMPACTOR_ADVERTISED_LISTENERS (Pulsar's advertisedListeners): parsed from the environment as
Pulsar writes it, bad values refused at start with a reason naming the entry at fault."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from api.main import app
from service.listeners import Listener
from service.settings import Settings


@pytest.fixture(autouse=True)
def _data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("COMPACTOR_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("COMPACTOR_ADVERTISED_LISTENERS", raising=False)
    monkeypatch.delenv("COMPACTOR_INTERNAL_LISTENER_NAME", raising=False)


def test_listeners_from_the_environment_in_pulsars_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "COMPACTOR_ADVERTISED_LISTENERS",
        " internal:pulsar://10.0.0.5:6650 , external:pulsar://broker.example.com:6651,",
    )
    s = Settings()
    assert s.advertised_listeners == {
        "internal": Listener("pulsar://10.0.0.5:6650"),
        "external": Listener("pulsar://broker.example.com:6651"),
    }
    # The first is the internal one: what a client that names no listener is answered.
    assert s.internal_listener_name == "internal"
    assert s.broker_service_url == "pulsar://10.0.0.5:6650"


def test_the_internal_listener_can_be_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTOR_ADVERTISED_LISTENERS", "a:pulsar://h1:6650,b:pulsar://h2:6650")
    monkeypatch.setenv("COMPACTOR_INTERNAL_LISTENER_NAME", "b")
    assert Settings().broker_service_url == "pulsar://h2:6650"


def test_without_listeners_the_broker_url_is_as_before() -> None:
    s = Settings(host="127.0.0.1", broker_service_port=6650)
    assert s.advertised_listeners == {}
    assert s.internal_listener_name == ""
    assert s.broker_service_url == "pulsar://127.0.0.1:6650"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("pulsar://h:6650", "has no listener name"),
        (":pulsar://h:6650", "has no listener name"),
        ("a:http://h:8080", "is not pulsar://host:port"),
        ("a:pulsar://h", "is not pulsar://host:port"),
        ("a:pulsar://h:notaport", "is not pulsar://host:port"),
        ("a:pulsar://h:6650/path", "is not pulsar://host:port"),
        ("a:pulsar://h:1,a:pulsar://h:2", "has two pulsar:// URLs"),
        ("a:pulsar://h:6650,b:pulsar://h:6650", "both name h:6650"),
        ("a:pulsar+ssl://h:6651", "has no pulsar:// URL"),
        ("a:pulsar://h:6650,a:pulsar+ssl://h:6651", "not served over TLS"),
    ],
)
def test_a_malformed_listener_list_is_refused(monkeypatch: pytest.MonkeyPatch, raw: str, reason: str) -> None:
    monkeypatch.setenv("COMPACTOR_ADVERTISED_LISTENERS", raw)
    with pytest.raises(ValidationError, match=reason):
        Settings()


def test_an_internal_listener_that_is_not_a_listener_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTOR_INTERNAL_LISTENER_NAME", "c")
    with pytest.raises(ValidationError, match="needs advertised_listeners"):
        Settings()
    monkeypatch.setenv("COMPACTOR_ADVERTISED_LISTENERS", "a:pulsar://h1:6650,b:pulsar://h2:6650")
    with pytest.raises(ValidationError, match=r"'c' is not one of advertised_listeners \(a, b\)"):
        Settings()


def test_listeners_need_the_binary_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTOR_ADVERTISED_LISTENERS", "a:pulsar://h1:6650")
    with pytest.raises(ValidationError, match="broker_service_port=0"):
        Settings(broker_service_port=0)


def test_serve_stops_on_a_bad_listener_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTOR_ADVERTISED_LISTENERS", "internal:pulsar://h:6650,external")
    result = CliRunner().invoke(app, ["serve"])
    assert result.exit_code == 2
    flat = re.sub(r"[\s│]+", " ", result.output)  # however the usage error's box wraps it
    assert "advertised_listeners: 'external' has no listener name" in flat
