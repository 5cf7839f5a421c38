"""Advertised listeners, as Pulsar's ``advertisedListeners`` names them.

A listener is a name and the URLs under which clients on some network reach this instance's
binary protocol: ``internal:pulsar://10.0.0.5:6650,external:pulsar://broker.example.com:6650``.
A client that asks for a listener by name (the Python client's ``listener_name=``, sent in
``LOOKUP``; ``listenerName`` on the HTTP lookup) is answered that listener's URL; one that asks
for a name the service does not have is refused, as Pulsar's broker refuses it. The first
listener (or ``COMPACTOR_INTERNAL_LISTENER_NAME``) is the one a client that names none gets.

The rules are Pulsar's (``MultipleListenerValidator``): every listener has one ``pulsar://``
URL and at most one ``pulsar+ssl://`` URL; one ``host:port`` belongs to one listener.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

SCHEMES = ("pulsar", "pulsar+ssl")


@dataclass(frozen=True)
class Listener:
    """Where clients of one network reach the binary protocol."""

    broker_url: str  # pulsar://host:port
    broker_url_tls: str | None = None  # pulsar+ssl://host:port, if it has one


def unknown_listener_reason(name: str, known: list[str]) -> str:
    """Why a lookup naming ``name`` is refused. It begins with Pulsar's own words, which
    Pulsar's C++ client (inside the Python one) matches to fail at once rather than retry."""
    have = ", ".join(known) if known else "none"
    return f"the broker do not have {name} listener (advertised listeners: {have})"


def parse_listeners(text: str) -> dict[str, Listener]:
    """``name:pulsar://host:port,name:pulsar+ssl://host:port,...`` as listeners by name, in the
    order they first appear; ``ValueError`` naming the entry at fault for anything else."""
    urls: dict[str, dict[str, str]] = {}
    owners: dict[str, str] = {}  # host:port -> the listener that has it
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        name, sep, url = entry.partition(":")
        name, url = name.strip(), url.strip().rstrip("/")
        if not sep or not name or url.startswith("//"):
            raise ValueError(f"{entry!r} has no listener name: write name:pulsar://host:port")
        scheme, address = _address(name, url)
        schemes = urls.setdefault(name, {})
        if scheme in schemes:
            raise ValueError(f"listener {name!r} has two {scheme}:// URLs ({schemes[scheme]} and {url})")
        schemes[scheme] = url
        other = owners.setdefault(address, name)
        if other != name:
            raise ValueError(f"listeners {other!r} and {name!r} both name {address}: one address each")
    listeners = {}
    for name, schemes in urls.items():
        if "pulsar" not in schemes:
            raise ValueError(f"listener {name!r} has no pulsar:// URL")
        listeners[name] = Listener(schemes["pulsar"], schemes.get("pulsar+ssl"))
    return listeners


def _address(name: str, url: str) -> tuple[str, str]:
    """The scheme and ``host:port`` of a listener's URL."""
    bad = f"listener {name!r}: {url!r} is not pulsar://host:port or pulsar+ssl://host:port"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError(bad) from None
    if parts.scheme not in SCHEMES or not parts.hostname or port is None:
        raise ValueError(bad)
    if parts.path or parts.query or parts.fragment or parts.username is not None:
        raise ValueError(bad)
    return parts.scheme, f"{parts.hostname}:{port}"
