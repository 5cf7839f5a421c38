from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from service.settings import Settings


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        # The namespace the API tests use (topics are created only in one that exists).
        assert c.put("/admin/v2/tenants/t").status_code == 204
        assert c.put("/admin/v2/namespaces/t/ns").status_code == 204
        yield c
