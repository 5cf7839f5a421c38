"""Settings of a Spark cluster: parsed from the environment, bad values refused at start."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from api.main import app
from service.settings import Settings


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ('{"spark.executor.memory": "2g", "spark.executor.cores": 2, "spark.speculation": true}',
         {"spark.executor.memory": "2g", "spark.executor.cores": "2", "spark.speculation": "true"}),
        ("spark.executor.memory=2g, spark.driver.host=10.0.0.5", {"spark.executor.memory": "2g",
                                                                  "spark.driver.host": "10.0.0.5"}),
        ("spark.executor.extraJavaOptions=-Da=b -Dc=d", {"spark.executor.extraJavaOptions": "-Da=b -Dc=d"}),
        ("", {}),
    ],
)  # fmt: skip
def test_spark_conf_from_the_environment(monkeypatch: pytest.MonkeyPatch, raw: str, parsed: dict) -> None:
    monkeypatch.setenv("COMPACTOR_SPARK_CONF", raw)
    assert Settings().spark_conf == parsed


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("spark.executor.memory", "has no '='"),
        ('{"spark.a": ', "not valid JSON"),
        ("executor.memory=2g", "spark.* settings only"),
        ('{"spark.a": {"b": 1}}', "must be a string, number or boolean"),
    ],
)
def test_a_malformed_spark_conf_is_refused(monkeypatch: pytest.MonkeyPatch, raw: str, reason: str) -> None:
    monkeypatch.setenv("COMPACTOR_SPARK_CONF", raw)
    with pytest.raises(ValidationError, match=reason):
        Settings()


def test_cluster_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTOR_SPARK_MASTER", " spark://10.0.0.1:7077 ")
    monkeypatch.setenv("COMPACTOR_SPARK_PYTHON", "./environment/bin/python")
    monkeypatch.setenv("COMPACTOR_SPARK_ARCHIVES", "hdfs:///envs/compactor.tar.gz#environment")
    s = Settings()
    assert s.spark_master == "spark://10.0.0.1:7077"
    assert s.spark_python == "./environment/bin/python"
    assert s.spark_archives == "hdfs:///envs/compactor.tar.gz#environment"


def test_spark_connect_is_refused_with_the_reason() -> None:
    with pytest.raises(ValidationError, match="Spark Connect"):
        Settings(spark_master="sc://127.0.0.1:15002")


def test_serve_stops_on_a_bad_setting_with_the_reason(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("COMPACTOR_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("COMPACTOR_SPARK_CONF", "spark.executor.memory")
    result = CliRunner().invoke(app, ["serve"])
    assert result.exit_code == 2
    assert "spark_conf must be a JSON object or k=v,k=v" in result.output


def test_the_row_group_cache_is_sized_for_object_storage_and_off_on_a_local_disk(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    from service.settings import OBJECT_STORAGE_CACHE_BYTES

    monkeypatch.setenv("COMPACTOR_DATA_DIR", str(tmp_path))
    assert Settings().row_group_cache_bytes() == 0  # the page cache does it
    bucket = Settings(storage_url="s3://bucket/prefix", s3_endpoint_url="http://127.0.0.1:1")
    assert bucket.row_group_cache_bytes() == OBJECT_STORAGE_CACHE_BYTES
    monkeypatch.setenv("COMPACTOR_CACHE_BYTES", "1048576")
    assert Settings().row_group_cache_bytes() == 1 << 20  # told to: on a local disk too
    monkeypatch.setenv("COMPACTOR_CACHE_BYTES", "0")
    assert (
        Settings(
            storage_url="s3://bucket/prefix", s3_endpoint_url="http://127.0.0.1:1"
        ).row_group_cache_bytes()
        == 0
    )
    monkeypatch.setenv("COMPACTOR_CACHE_BYTES", "-1")
    with pytest.raises(ValidationError, match="cache_bytes"):
        Settings()
