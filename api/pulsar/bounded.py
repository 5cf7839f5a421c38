"""``BoundedDict``: state kept for a client that may never come back for it (a reader's position
after its seek, a consumer's batches sent and not acknowledged), with a bound on how much."""

from __future__ import annotations


class BoundedDict(dict):  # type: ignore[type-arg]
    """A dict that forgets its oldest entries beyond ``limit`` (state a client may never
    come back for)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: object, value: object) -> None:
        super().__setitem__(key, value)
        while len(self) > self.limit:
            del self[next(iter(self))]
