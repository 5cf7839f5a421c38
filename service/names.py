"""Topic names: ``persistent://{tenant}/{namespace}/{topic}``.

Name parts become directory names, so each is checked against a strict pattern and
``.``/``..`` are refused: no client input can reach outside the storage root.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.errors import InvalidInput

_PART = re.compile(r"^[A-Za-z0-9_.=-]{1,128}$")
PREFIX = "persistent://"


def check_part(kind: str, value: str) -> str:
    if not _PART.match(value) or value in (".", ".."):
        raise InvalidInput(
            f"invalid {kind} name {value!r}: use 1-128 of A-Z a-z 0-9 _ . = - (and not '.' or '..')"
        )
    return value


@dataclass(frozen=True, slots=True)
class TopicName:
    tenant: str
    namespace: str
    topic: str

    @classmethod
    def of(cls, tenant: str, namespace: str, topic: str) -> TopicName:
        return cls(
            check_part("tenant", tenant), check_part("namespace", namespace), check_part("topic", topic)
        )

    @classmethod
    def parse(cls, text: str) -> TopicName:
        """Parse ``persistent://t/n/x`` (the prefix may be left out)."""
        rest = text.removeprefix(PREFIX)
        parts = rest.split("/")
        if len(parts) != 3:
            raise InvalidInput(f"invalid topic name {text!r}: expected persistent://tenant/namespace/topic")
        return cls.of(*parts)

    def __str__(self) -> str:
        return f"{PREFIX}{self.tenant}/{self.namespace}/{self.topic}"


PARTITION_SUFFIX = "-partition-"
_PARTITION = re.compile(r"^(?P<base>.+)-partition-(?P<index>0|[1-9][0-9]{0,8})$")


def partition(name: TopicName, index: int) -> TopicName:
    """Partition ``index`` of the partitioned topic ``name``."""
    return TopicName.of(name.tenant, name.namespace, f"{name.topic}{PARTITION_SUFFIX}{index}")


def partition_of(name: TopicName) -> tuple[TopicName, int] | None:
    """``(partitioned topic, index)`` when ``name`` is written as a partition's name, else None."""
    m = _PARTITION.match(name.topic)
    if m is None:
        return None
    return TopicName(name.tenant, name.namespace, m["base"]), int(m["index"])
