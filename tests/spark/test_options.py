"""Options of the rcq data source: parsed with clear errors, in Spark and without it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from rcq.spark.options import RcqOptionError, parse_options, sink_id_of

URL = "http://127.0.0.1:1"


@pytest.mark.parametrize(("options", "message"), [
    ({"queue": "q"}, "option url is required"),
    ({"url": "localhost:7001", "queue": "q"}, "is not http://host:port"),
    ({"url": URL}, "option queue is required"),
    ({"url": URL, "queue": "a/b"}, "is not a queue name"),
    ({"url": URL, "queue": "q", "batchSize": "many"}, "option batchSize='many' is not an integer"),
    ({"url": URL, "queue": "q", "batchSize": "0"}, "option batchSize=0 is out of range"),
    ({"url": URL, "queue": "q", "numPartitions": "-2"}, "option numPartitions=-2 is out of range"),
    ({"url": URL, "queue": "q", "transactionTimeoutSeconds": "7200"}, "transactionTimeoutSeconds=7200.0 is out of range"),
    ({"url": URL, "queue": "q", "valueType": "json"}, "option valueType='json' is unknown"),
    ({"url": URL, "queue": "q", "consumerId": "a b"}, "option consumerId='a b' is malformed"),
])
def test_bad_options_are_refused_with_a_clear_message(options: dict[str, str], message: str) -> None:
    with pytest.raises(RcqOptionError, match=message):
        parse_options({k.lower(): v for k, v in options.items()})


def test_options_have_defaults_and_the_sink_id_follows_the_checkpoint() -> None:
    options = parse_options({"url": f"{URL}, http://127.0.0.1:2/", "queue": "q", "maxitemsperpartition": "5"})
    assert options.urls == (URL, "http://127.0.0.1:2")
    assert (options.value_type, options.batch_size, options.max_items_per_partition) == ("binary", 1000, 5)
    first = sink_id_of(options, {"checkpointlocation": "/data/cp"})
    assert first == sink_id_of(options, {"checkpointlocation": "/data/cp"}) != sink_id_of(options, {"checkpointlocation": "/x"})
    with pytest.raises(RcqOptionError, match="needs option sinkId or a checkpointLocation"):
        sink_id_of(options, {})


@pytest.mark.spark
def test_bad_options_fail_the_spark_call_with_the_same_message(spark: Any, urls: str) -> None:
    df = spark.range(3).selectExpr("cast(id as string) AS value")
    with pytest.raises(Exception, match="option url is required"):
        df.write.format("rcq").option("queue", "q").mode("append").save()
    with pytest.raises(Exception, match="option queue is required"):
        df.write.format("rcq").option("url", urls).mode("append").save()
    with pytest.raises(Exception, match="option batchSize='x' is not an integer"):
        df.write.format("rcq").option("url", urls).option("queue", "q").option("batchSize", "x").mode("append").save()
    with pytest.raises(Exception, match="option consumerId is required"):
        spark.readStream.format("rcq").option("url", urls).option("queue", "q").load() \
            .writeStream.format("noop").start().awaitTermination(60)
    with pytest.raises(Exception, match=r"rcq\.spark\.drain"):
        spark.read.format("rcq").option("url", urls).option("queue", "q").load().collect()


@pytest.mark.spark
def test_unreachable_cluster_fails_the_write_with_the_rcq_error_code(spark: Any) -> None:
    # the driver reads the queue's placement before any task runs (a spread queue's tasks each pick a fragment)
    df = spark.range(3).selectExpr("cast(id as string) AS value")
    with pytest.raises(Exception, match="rcq unavailable: reading the queue's placement"):
        df.write.format("rcq").option("url", URL).option("queue", "q").option("retryTimeoutSeconds", "0.5") \
            .mode("append").save()


TOKEN = "rcq_Secret-Token_0123456789abcdefghijklmnopqrstu"


def self_signed_ca_pem() -> str:
    """A CA certificate, as an operator's caFile would hold."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rcq test CA")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now)
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(key, hashes.SHA256()))
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


@pytest.fixture(autouse=True)
def no_token_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RCQ_TOKEN", raising=False)


def test_the_token_option_is_parsed_and_never_shown() -> None:
    options = parse_options({"url": URL, "queue": "q", "token": f" {TOKEN}\n"})
    assert options.token == TOKEN
    assert TOKEN not in repr(options) and TOKEN not in str(options) and "token" not in repr(options)
    assert parse_options({"url": URL, "queue": "q"}).token is None


@pytest.mark.parametrize(("extra", "message"), [
    ({"token": "two words"}, "option token must be one token: printable characters, no spaces .the value is not shown"),
    ({"token": ""}, "option token must be one token"),
    ({"token": "two words", "tokenfile": "/nonexistent"}, "options token and tokenFile exclude each other"),
])
def test_a_bad_token_option_is_refused_without_showing_it(extra: dict[str, str], message: str) -> None:
    with pytest.raises(RcqOptionError, match=message) as refused:
        parse_options({"url": URL, "queue": "q", **extra})
    assert "two words" not in str(refused.value)


def test_a_bad_option_beside_the_token_does_not_show_the_token() -> None:
    with pytest.raises(RcqOptionError, match="batchSize") as refused:
        parse_options({"url": URL, "queue": "q", "token": TOKEN, "batchsize": "many"})
    assert TOKEN not in str(refused.value)


def test_the_token_file_is_read_on_the_driver_and_must_be_private(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    options = parse_options({"url": URL, "queue": "q", "tokenfile": str(token_file)})
    assert options.token == TOKEN and TOKEN not in repr(options)
    token_file.chmod(0o644)
    with pytest.raises(RcqOptionError, match=f"option tokenFile: .*chmod 600 {re.escape(str(token_file))}") as refused:
        parse_options({"url": URL, "queue": "q", "tokenfile": str(token_file)})
    assert TOKEN not in str(refused.value)


def test_without_token_options_the_drivers_environment_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RCQ_TOKEN", TOKEN)
    assert parse_options({"url": URL, "queue": "q"}).token == TOKEN
    monkeypatch.setenv("RCQ_TOKEN", "not one token")
    with pytest.raises(RcqOptionError, match="RCQ_TOKEN must be one token") as refused:
        parse_options({"url": URL, "queue": "q"})
    assert "not one token" not in str(refused.value)


def test_the_ca_file_travels_as_certificates(tmp_path: Path) -> None:
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text(self_signed_ca_pem())
    options = parse_options({"url": "https://127.0.0.1:1", "queue": "q", "cafile": str(ca_file)})
    assert options.ca_pem == ca_file.read_text() and options.tls_context() is not None
    assert parse_options({"url": URL, "queue": "q"}).tls_context() is None
    ca_file.write_text("not a certificate")
    with pytest.raises(RcqOptionError, match=r"option caFile=.* cannot be used"):
        parse_options({"url": URL, "queue": "q", "cafile": str(ca_file)})
    with pytest.raises(RcqOptionError, match=r"option caFile=.* cannot be used"):
        parse_options({"url": URL, "queue": "q", "cafile": str(tmp_path / "missing.pem")})


def test_every_client_of_the_connector_gets_the_token_and_the_cas(monkeypatch: pytest.MonkeyPatch) -> None:
    from rcq.spark import remote

    made: list[dict[str, Any]] = []

    class Recorder:
        def __init__(self, urls: list[str], **settings: Any) -> None:
            made.append(settings)

    monkeypatch.setattr(remote, "RcqClient", Recorder)
    remote.client_for(parse_options({"url": URL, "queue": "q", "token": TOKEN}))
    without_token = parse_options({"url": URL, "queue": "q"})
    monkeypatch.setenv("RCQ_TOKEN", "an-executors-own-token")  # must not apply: the driver decided there is none
    remote.client_for(without_token)
    assert made[0]["token"] == TOKEN and made[0]["ssl_context"] is None
    assert made[1]["token"] == ""  # RcqClient sends no token for "" (None would read $RCQ_TOKEN)
