"""The broker's API keys (:mod:`broker_lite.auth`): loading and validating the keys file, 401 vs
403, prefixes, hashed keys, the loopback policy and the Kafka listener's refusal. Pure: no server, no environment."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker_lite.auth import (
    UNRESTRICTED,
    Auth,
    AuthConfigError,
    ExposureRefused,
    Forbidden,
    KafkaListenerUnauthenticated,
    Principal,
    Unauthenticated,
    check_exposure,
    check_kafka_listener,
    is_loopback,
)
from llog.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
INGEST_KEY = "ingest-secret-1"
KEYS = {"keys": [
    {"name": "ingest", "key_sha256": hashlib.sha256(INGEST_KEY.encode()).hexdigest(),
     "produce": ["orders.", "clicks"]},
    {"name": "reports", "key": "reports-secret", "consume": ["orders."], "groups": ["reports-"]},
    {"name": "ops", "key": "ops-secret", "produce": ["*"], "consume": ["*"], "groups": ["*"], "admin": True},
]}


@pytest.fixture
def auth() -> Auth:
    return Auth.load(json.dumps(KEYS))


def _bearer(key: str) -> list[tuple[bytes, bytes]]:
    return [(b"host", b"x"), (b"authorization", f"Bearer {key}".encode())]


# --- loading -------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [None, "", "  "])
def test_unset_means_auth_off(value):
    assert Auth.load(value) is None
    assert Auth.from_environ({}) is None


def test_loads_a_file_and_inline_json(tmp_path, auth):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(KEYS))
    from_file = Auth.load(str(path))
    assert from_file.names == auth.names == ["ingest", "reports", "ops"]
    assert Auth.from_environ({"LLOG_BROKER_AUTH": str(path)}).names == auth.names
    assert from_file.authenticate(_bearer("ops-secret")).admin


def _error(value) -> str:
    with pytest.raises(AuthConfigError) as raised:
        Auth.load(value if isinstance(value, str) else json.dumps(value))
    assert isinstance(raised.value, ConfigError)  # `python -m broker_lite` reports ConfigErrors and exits 2
    return str(raised.value)


def _keys(*entries) -> dict:
    return {"keys": list(entries)}


@pytest.mark.parametrize("value, expected", [
    ("/nonexistent/keys.json", "file '/nonexistent/keys.json': cannot read it"),
    ("{not json", "not JSON"),
    ({}, "missing required field `keys`"),
    (_keys(), "`keys` is empty"),
    ({"keys": [], "extra": 1}, "unknown field `extra`"),
    (_keys({"name": "a", "key": "k", "produce": ["x"], "prodcue": ["y"]}), "unknown field `prodcue` - at `$.keys[0]`"),
    (_keys({"key": "k"}), "missing required field `name` - at `$.keys[0]`"),
    (_keys({"name": "", "key": "k"}), "length >= 1 - at `$.keys[0].name`"),
    (_keys({"name": "a", "key": "k", "produce": "orders"}), "Expected `array`, got `str` - at `$.keys[0].produce`"),
    (_keys({"name": "a", "key": "k", "admin": "yes"}), "Expected `bool`"),
    (_keys({"name": "a"}), "`$.keys[0]`: give exactly one of `key`"),
    (_keys({"name": "a", "key": "k", "key_sha256": "0" * 64}), "`$.keys[0]`: give exactly one of `key`"),
    (_keys({"name": "a", "key": ""}), "length >= 1 - at `$.keys[0].key`"),
    (_keys({"name": "a", "key_sha256": "abc"}), "`$.keys[0]`.key_sha256: expected 64 hex digits"),
    (_keys({"name": "a", "key_sha256": "g" * 64}), "with non-hex ones"),
    (_keys({"name": "a", "key": "k"}, {"name": "a", "key": "l"}),
     "`$.keys[1]`: name 'a' is also the name of $.keys[0]"),
    (_keys({"name": "a", "key": "k"}, {"name": "b", "key_sha256": hashlib.sha256(b"k").hexdigest()}),
     "`$.keys[1]`: key 'b' is the same key as 'a'"),
    (_keys({"name": "a", "key": "k", "consume": ["orders.*"]}), "`$.keys[0]`.consume[0]: 'orders.*' '*' stands alone"),
    (_keys({"name": "a", "key": "k", "groups": ["ok", "a/b"]}), "`$.keys[0]`.groups[1]: 'a/b' contains '/'"),
    (_keys({"name": "a", "key": "k", "produce": [""]}), "length >= 1 - at `$.keys[0].produce[0]`"),
])
def test_bad_files_are_refused_naming_the_problem(value, expected):
    message = _error(value)
    assert "LLOG_BROKER_AUTH" in message and expected in message, message


def test_errors_never_show_a_key():
    message = _error(_keys({"name": "a", "key": "top-secret"}, {"name": "b", "key": "top-secret"}))
    assert "top-secret" not in message


# --- authentication: 401 -------------------------------------------------------------------------

def test_plain_and_hashed_keys_authenticate(auth):
    assert auth.authenticate(_bearer(INGEST_KEY)).name == "ingest"
    assert auth.authenticate(_bearer("reports-secret")).name == "reports"
    assert auth.authenticate([(b"x-api-key", b"reports-secret")]).name == "reports"
    assert auth.authenticate([(b"authorization", b"bearer   ops-secret ")]).name == "ops"  # scheme is case-insensitive
    both = [(b"authorization", b"Bearer ops-secret"), (b"x-api-key", b"ops-secret")]
    assert auth.authenticate(both).name == "ops"


def test_a_hashed_key_is_not_its_own_digest(auth):
    with pytest.raises(Unauthenticated):
        auth.authenticate(_bearer(hashlib.sha256(INGEST_KEY.encode()).hexdigest()))


@pytest.mark.parametrize("headers, message, invalid_token", [
    ([], "wants an API key", False),
    ([(b"authorization", b"Bearer wrong")], "unknown API key", True),
    ([(b"x-api-key", b"wrong")], "unknown API key", True),
    ([(b"authorization", b"Basic b3BzOm9wcy1zZWNyZXQ=")], "must be `Bearer <key>`", True),
    ([(b"authorization", b"ops-secret")], "must be `Bearer <key>`", True),
    ([(b"authorization", b"Bearer")], "is empty", True),
    ([(b"authorization", b"Bearer  ")], "is empty", True),
    ([(b"x-api-key", b"")], "is empty", True),
    ([(b"authorization", b"Bearer ops-secret"), (b"authorization", b"Bearer ops-secret")], "more than one", True),
    ([(b"authorization", b"Bearer ops-secret"), (b"x-api-key", b"reports-secret")], "different keys", True),
    ([(b"authorization", b"Bearer \xff\xfe")], "unknown API key", True),
])
def test_unauthenticated_is_401_with_a_challenge(auth, headers, message, invalid_token):
    with pytest.raises(Unauthenticated) as raised:
        auth.authenticate(headers)
    error = raised.value
    assert (error.status, error.error_type) == (401, "Unauthenticated") and message in str(error)
    (name, challenge), = error.headers
    assert name == b"www-authenticate" and challenge.startswith(b'Bearer realm="llog"')
    assert (b'error="invalid_token"' in challenge) == invalid_token
    assert b"secret" not in str(error).encode()


# --- permissions: 403 ----------------------------------------------------------------------------

def test_prefixes_and_star(auth):
    ingest = auth.authenticate(_bearer(INGEST_KEY))
    ingest.require("produce", ["orders.eu", "orders.", "clicks", "clicks-raw"])  # plain prefixes
    assert not ingest.allows("produce", "orders") and not ingest.allows("produce", "views")
    assert not ingest.allows("consume", "orders.eu") and not ingest.allows("admin")
    ops = auth.authenticate(_bearer("ops-secret"))
    for action in ("produce", "consume", "groups"):
        ops.require(action, ["anything", "x"])
    ops.require("admin")


def test_forbidden_is_403_naming_key_action_and_first_topic_not_allowed(auth):
    ingest = auth.authenticate(_bearer(INGEST_KEY))
    with pytest.raises(Forbidden) as raised:
        ingest.require("produce", ["orders.eu", "views", "payments"])
    error = raised.value
    assert (error.status, error.error_type, error.headers) == (403, "Forbidden", [])
    assert (error.key_name, error.action, error.name) == ("ingest", "produce", "views")
    assert str(error) == "key 'ingest' may not produce to topic 'views' (not in its 'produce' permissions)"
    with pytest.raises(Forbidden, match="key 'ingest' may not consume from topic 'orders.eu'"):
        ingest.require("consume", ["orders.eu"])
    with pytest.raises(Forbidden, match="key 'ingest' may not admin"):
        ingest.require("admin")


def test_groups_need_the_group_and_its_topics(auth):
    reports = auth.authenticate(_bearer("reports-secret"))
    reports.require("groups", ["reports-daily"])
    reports.require("consume", ["orders.eu"])
    with pytest.raises(Forbidden, match="may not use consumer group 'billing'"):
        reports.require("groups", ["billing"])
    with pytest.raises(Forbidden, match="may not consume from topic 'clicks'"):
        reports.require("consume", ["orders.eu", "clicks"])


def test_nothing_granted_by_default_and_unknown_actions_refused():
    nobody = Principal("nobody")
    for action in ("produce", "consume", "groups"):
        with pytest.raises(Forbidden):
            nobody.require(action, ["t"])
        nobody.require(action, [])  # nothing named, nothing to refuse
    with pytest.raises(ValueError, match="unknown action"):
        nobody.require("delete", ["t"])


def test_unrestricted_when_auth_is_off():
    for action in ("produce", "consume", "groups"):
        UNRESTRICTED.require(action, ["any", "topic"])
    UNRESTRICTED.require("admin")


# --- loopback policy -----------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "::ffff:127.0.0.1"])
def test_loopback_without_auth_is_allowed(host):
    assert is_loopback(host)
    check_exposure(host, None, insecure=False)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.1.2.3", "192.168.0.1", "2001:db8::1",
                                  "no-such-host.invalid"])
def test_other_addresses_need_auth_or_insecure(host, auth):
    assert not is_loopback(host)
    with pytest.raises(ExposureRefused, match="LLOG_BROKER_AUTH.*--insecure") as raised:
        check_exposure(host, None, insecure=False)
    assert isinstance(raised.value, ConfigError)
    check_exposure(host, auth, insecure=False)
    check_exposure(host, None, insecure=True)


def test_the_kafka_listener_is_refused_beside_auth(auth):
    with pytest.raises(KafkaListenerUnauthenticated, match=r"--kafka-port 9092\) has no authentication.*"
                                                           r"LLOG_BROKER_AUTH") as raised:
        check_kafka_listener(auth, 9092)
    assert isinstance(raised.value, ConfigError)
    check_kafka_listener(auth, None)
    check_kafka_listener(None, 9092)


# --- python -m broker_lite.auth ------------------------------------------------------------------

def test_cli_hash_and_new():
    run = [sys.executable, "-m", "broker_lite.auth"]
    hashed = subprocess.run(run + ["hash"], input=f"{INGEST_KEY}\n", capture_output=True, text=True, cwd=REPO,
                            check=True)
    assert hashed.stdout.strip() == KEYS["keys"][0]["key_sha256"]
    new = subprocess.run(run + ["new", "svc"], capture_output=True, text=True, cwd=REPO, check=True).stdout
    key = new.split("key:", 1)[1].split()[0]
    entry = json.loads(new.split("entry:", 1)[1])
    assert Auth.load(json.dumps({"keys": [entry]})).authenticate(_bearer(key)).name == "svc"
    assert subprocess.run(run + ["bogus"], capture_output=True, cwd=REPO).returncode == 2
