"""Config precedence and validation. Never reads the real environment or settings files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llog.config import CONFIG_FILE_ENV, ENV_NAMES, Config, example_toml, field_docs
from llog.errors import ConfigError


@pytest.fixture
def load(tmp_path: Path):
    """``load(options, env, settings, toml)``: Config.load with an explicit env, a private settings
    file (absent unless ``settings`` is given) and, when ``toml`` (the text) is given, a TOML
    config file that ``LLOG_CONFIG_FILE`` in the env names."""

    def _load(options: dict | None = None, env: dict | None = None, settings: dict | None = None,
              toml: str | None = None) -> Config:
        path = tmp_path / "settings.json"
        if settings is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(json.dumps(settings))
        env = dict(env or {})
        if toml is not None:
            (tmp_path / "llog.toml").write_text(toml)
            env[CONFIG_FILE_ENV] = str(tmp_path / "llog.toml")
        return Config.load(options=options, env=env, settings_path=path)

    return _load


def test_defaults(load):
    assert load() == Config()
    config = load()
    assert (config.oxia_namespace, config.root_prefix, config.s3_region_name) == ("default", "llog", "us-east-1")
    assert (config.oxia_session_timeout_ms, config.s3_bucket, config.s3_secret_access_key) == (30_000, None, None)


# --- precedence ----------------------------------------------------------------------------------

# One value per layer; each case removes the layers above the expected winner.
LAYERS = ["option", "env", "file", "settings", "aws"]


@pytest.mark.parametrize("top", range(len(LAYERS)))
def test_secret_precedence(load, top):
    present = LAYERS[top:]
    config = load(
        options={"llog.s3.secret.access.key": "from-option"} if "option" in present else None,
        env={**({"LLOG_S3_SECRET_ACCESS_KEY": "from-env"} if "env" in present else {}),
             **({"AWS_SECRET_ACCESS_KEY": "from-aws"} if "aws" in present else {})},
        settings={"LLOG_S3_SECRET_ACCESS_KEY": "from-settings"} if "settings" in present else None,
        toml='LLOG_S3_SECRET_ACCESS_KEY = "from-file"\n' if "file" in present else None,
    )
    assert config.s3_secret_access_key == f"from-{LAYERS[top]}"


def test_secret_default_when_no_layer_sets_it(load):
    assert load(env={"UNRELATED": "x"}).s3_secret_access_key is None


@pytest.mark.parametrize(
    "options,env,settings,expected",
    [
        ({"llog.s3.bucket": "opt"}, {"LLOG_S3_BUCKET": "env"}, {"LLOG_S3_BUCKET": "file"}, "opt"),
        (None, {"LLOG_S3_BUCKET": "env"}, {"LLOG_S3_BUCKET": "file"}, "env"),
        (None, {}, {"LLOG_S3_BUCKET": "file"}, "file"),
        (None, {}, None, None),
        # Empty values do not count as set: the next layer down wins.
        ({"llog.s3.bucket": ""}, {"LLOG_S3_BUCKET": "env"}, None, "env"),
        ({"llog.s3.bucket": None}, {"LLOG_S3_BUCKET": ""}, {"LLOG_S3_BUCKET": "file"}, "file"),
        (None, {}, {"LLOG_S3_BUCKET": ""}, None),
    ],
)
def test_bucket_precedence(load, options, env, settings, expected):
    assert load(options, env, settings).s3_bucket == expected


@pytest.mark.parametrize(
    "env,settings,expected",
    [
        ({"AWS_DEFAULT_REGION": "eu-west-1"}, None, "eu-west-1"),
        ({"AWS_REGION": "eu-central-1", "AWS_DEFAULT_REGION": "eu-west-1"}, None, "eu-central-1"),
        ({"AWS_REGION": "eu-central-1"}, {"LLOG_S3_REGION_NAME": "ap-south-1"}, "ap-south-1"),
        ({"AWS_REGION": "eu-central-1", "LLOG_S3_REGION_NAME": "us-west-2"}, None, "us-west-2"),
        ({}, None, "us-east-1"),
    ],
)
def test_region_fallbacks(load, env, settings, expected):
    assert load(env=env, settings=settings).s3_region_name == expected


def test_aws_fallbacks_cover_credentials(load):
    config = load(env={"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_SESSION_TOKEN": "tok"})
    assert (config.s3_access_key_id, config.s3_secret_access_key, config.s3_session_token) == ("AKIA", "s3cr3t", "tok")


def test_aws_names_do_not_set_llog_only_fields(load):
    assert load(env={"AWS_ENDPOINT_URL": "http://x", "AWS_BUCKET": "b"}) == Config()


def test_layers_combine_field_by_field(load):
    config = load(
        options={"llog.s3.bucket": "opt-bucket"},
        env={"LLOG_OXIA_SERVICE_ADDRESS": "env:6648"},
        settings={"LLOG_S3_ENDPOINT_URL": "http://file:8333", "LLOG_S3_BUCKET": "file-bucket"},
    )
    assert (config.s3_bucket, config.oxia_service_address, config.s3_endpoint_url) == (
        "opt-bucket", "env:6648", "http://file:8333")


# --- option keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["LLOG_S3_BUCKET", "llog.s3.bucket", "llog.s3_bucket", "LLOG.S3.BUCKET", "llog.S3_Bucket", "llog.s3-bucket"],
)
def test_option_key_spellings(load, key):
    assert load(options={key: "b"}).s3_bucket == "b"


@pytest.mark.parametrize("field_name,env_name", sorted(ENV_NAMES.items()))
def test_every_field_has_an_option_and_env_name(load, field_name, env_name):
    kind = Config.__dataclass_fields__[field_name].type
    raw, expected = {"int": ("2500", 2500), "float": ("2.5", 2.5), "bool": ("false", False)}.get(kind, ("v", "v"))
    if field_name == "broker_role":  # one of three values
        raw = expected = "read"
    if field_name == "compression_type":
        raw = expected = "zstd"
    if field_name == "topic_config":  # JSON of topic -> settings
        raw = expected = '{"t": {"compression.type": "lz4"}}'
    dotted = "llog." + field_name.replace("_", ".")
    typed = json.dumps(expected) if kind in ("int", "float", "bool") else json.dumps(raw)  # JSON: TOML here
    for config in (load(options={dotted: raw}), load(env={env_name: raw}), load(settings={env_name: raw}),
                   load(toml=f"{env_name} = {typed}\n")):
        assert getattr(config, field_name) == expected


def test_environment_names_as_options_in_any_case(load):
    """Spark hands data source options over lower-cased."""
    assert load(options={"llog_s3_bucket": "lower", "LLOG_ROOT_PREFIX": "upper"}).s3_bucket == "lower"
    assert load(options={"llog_root_prefix": "r1"}).root_prefix == "r1"


@pytest.mark.parametrize("unknown", ["llog.s3.bukket", "LLOG_BOGUS", "llog_s3_bukket", "llog.", "Llog.Nope"])
def test_unknown_llog_option(load, unknown):
    with pytest.raises(ConfigError, match=f"unknown llog option\\(s\\) {re.escape(unknown)};") as info:
        load(options={unknown: "x", "llog.s3.bucket": "b"})
    assert "known options: " in str(info.value) and "llog.s3.bucket" in str(info.value)


def test_every_unknown_option_is_listed(load):
    with pytest.raises(ConfigError, match=re.escape("unknown llog option(s) llog.a, llog.b;")):
        load(options={"llog.b": "1", "llog.a": "2"})


def test_foreign_options_are_ignored(load):
    config = load(options={"topic": "orders", "path": "/x", "kafka.bootstrap.servers": "k:9092",
                           "checkpointLocation": "/c", "AWS_REGION": "xx", "llog.s3.bucket": "b"})
    assert config == Config(s3_bucket="b")


# --- coercion and validation ---------------------------------------------------------------------


def test_int_and_float_coercion(load):
    config = load(
        options={"llog.batch.max.bytes": "1024"},
        env={"LLOG_OXIA_SESSION_TIMEOUT_MS": "15000", "LLOG_S3_TIMEOUT_S": "2.5"},
        settings={"LLOG_CAS_MAX_ATTEMPTS": 3},
    )
    assert (config.batch_max_bytes, config.oxia_session_timeout_ms, config.cas_max_attempts) == (1024, 15000, 3)
    assert config.s3_timeout_s == 2.5
    assert isinstance(config.oxia_session_timeout_ms, int) and isinstance(config.s3_timeout_s, float)


def test_non_str_options_become_str(load):
    assert load(options={"llog.client.identifier": 7}).client_identifier == "7"


@pytest.mark.parametrize(
    "layer,name,value",
    [
        ("env", "LLOG_OXIA_SESSION_TIMEOUT_MS", "30s"),
        ("env", "LLOG_BATCH_MAX_BYTES", "8MiB"),
        ("env", "LLOG_S3_MAX_ATTEMPTS", "1.5"),
        ("option", "LLOG_CAS_MAX_ATTEMPTS", "many"),
        ("settings", "LLOG_OXIA_REQUEST_TIMEOUT_MS", "ten"),
        ("env", "LLOG_S3_TIMEOUT_S", "fast"),
    ],
)
def test_bad_number_names_the_variable(load, layer, name, value):
    kwargs = {"option": {"options": {name: value}}, "env": {"env": {name: value}},
              "settings": {"settings": {name: value}}}[layer]
    with pytest.raises(ConfigError, match=f"^{name}={re.escape(repr(value))} is not a valid (int|float)$"):
        load(**kwargs)


@pytest.mark.parametrize("timeout", [2000, 30_000, 300_000])
def test_session_timeout_in_range(load, timeout):
    assert load(env={"LLOG_OXIA_SESSION_TIMEOUT_MS": str(timeout)}).oxia_session_timeout_ms == timeout


@pytest.mark.parametrize("timeout", [0, 1999, 300_001, -5])
def test_session_timeout_out_of_range(load, timeout):
    with pytest.raises(ConfigError, match=re.escape(f"LLOG_OXIA_SESSION_TIMEOUT_MS={timeout} must be in 2000..300000")):
        load(options={"llog.oxia.session.timeout.ms": timeout})


@pytest.mark.parametrize(
    "changes,problem",
    [
        ({"s3_max_attempts": 0}, "LLOG_S3_MAX_ATTEMPTS=0 must be >= 1"),
        ({"batch_max_bytes": -1}, "LLOG_BATCH_MAX_BYTES=-1 must be >= 1"),
        ({"cas_max_attempts": 0}, "LLOG_CAS_MAX_ATTEMPTS=0 must be >= 1"),
        ({"oxia_request_timeout_ms": 0}, "LLOG_OXIA_REQUEST_TIMEOUT_MS=0 must be >= 1"),
        ({"s3_timeout_s": 0.0}, "LLOG_S3_TIMEOUT_S=0.0 must be > 0"),
        ({"root_prefix": ""}, "LLOG_ROOT_PREFIX=''"),
        ({"root_prefix": "/llog"}, "LLOG_ROOT_PREFIX='/llog'"),
        ({"root_prefix": "llog/"}, "LLOG_ROOT_PREFIX='llog/'"),
    ],
)
def test_invalid_values(changes, problem):
    with pytest.raises(ConfigError, match=re.escape(problem)):
        Config(**changes)


def test_all_problems_reported_together():
    with pytest.raises(ConfigError) as info:
        Config(oxia_session_timeout_ms=1, s3_max_attempts=0, root_prefix="/x")
    message = str(info.value)
    for name in ("LLOG_OXIA_SESSION_TIMEOUT_MS", "LLOG_S3_MAX_ATTEMPTS", "LLOG_ROOT_PREFIX"):
        assert name in message


def test_replace_validates():
    assert Config().replace(root_prefix="t1").root_prefix == "t1"
    with pytest.raises(ConfigError):
        Config().replace(oxia_session_timeout_ms=10)


# --- settings file -------------------------------------------------------------------------------


def test_settings_file_ignores_unknown_names(load):
    assert load(settings={"LLOG_S3_BUCKET": "b", "SOMETHING_ELSE": 1, "llog.s3.bucket": "x"}) == Config(s3_bucket="b")


@pytest.mark.parametrize("content,problem", [("{not json", "cannot read llog settings file"),
                                             ("[1, 2]", "must hold a JSON object")])
def test_bad_settings_file(tmp_path, content, problem):
    path = tmp_path / "settings.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=re.escape(problem)) as info:
        Config.load(env={}, settings_path=path)
    assert str(path) in str(info.value)


def test_missing_settings_file_is_fine(tmp_path):
    assert Config.load(env={}, settings_path=tmp_path / "nope" / "settings.json") == Config()


# --- require, to_options, repr -------------------------------------------------------------------


def test_require_lists_every_missing_setting_at_once(load):
    config = load(options={"llog.s3.bucket": "b"})
    with pytest.raises(ConfigError) as info:
        config.require("oxia_service_address", "s3_bucket", "s3_endpoint_url", "s3_access_key_id")
    message = str(info.value)
    assert message.startswith("missing llog settings: LLOG_OXIA_SERVICE_ADDRESS, LLOG_S3_ENDPOINT_URL, "
                              "LLOG_S3_ACCESS_KEY_ID (")
    assert "LLOG_S3_BUCKET" not in message


def test_require_returns_the_config_when_complete(load):
    config = load(env={"LLOG_OXIA_SERVICE_ADDRESS": "localhost:6648", "LLOG_S3_BUCKET": "b"})
    assert config.require("oxia_service_address", "s3_bucket") is config


def test_to_options_roundtrip(load):
    config = load(
        options={"llog.s3.bucket": "b", "llog.s3.secret.access.key": "sk", "llog.s3.timeout.s": "2.5"},
        env={"LLOG_OXIA_SERVICE_ADDRESS": "localhost:6648", "LLOG_OXIA_SESSION_TIMEOUT_MS": "12000",
             "AWS_SESSION_TOKEN": "tok", "AWS_REGION": "eu-west-1"},
        settings={"LLOG_ROOT_PREFIX": "prod/llog", "LLOG_CLIENT_IDENTIFIER": "spark-1"},
    )
    options = config.to_options()
    assert all(isinstance(v, str) for v in options.values())
    assert set(options) <= set(ENV_NAMES.values())
    assert options["LLOG_S3_BUCKET"] == "b" and options["LLOG_OXIA_SESSION_TIMEOUT_MS"] == "12000"
    assert "LLOG_S3_ENDPOINT_URL" not in options  # None fields are left out
    # Another process with a different environment rebuilds exactly this config from the options.
    assert load(options=options, env={"LLOG_S3_BUCKET": "other", "AWS_REGION": "us-west-1"}) == config


def test_to_options_of_defaults_roundtrips(load):
    assert load(options=Config().to_options()) == Config()


def test_secrets_are_not_in_repr(load):
    config = load(options={"llog.s3.secret.access.key": "SUPERSECRET", "llog.s3.session.token": "TOKENVALUE",
                           "llog.s3.access.key.id": "AKIDVISIBLE"})
    for text in (repr(config), str(config)):
        assert "SUPERSECRET" not in text and "TOKENVALUE" not in text
        assert "AKIDVISIBLE" in text  # the access key id is not secret, and proves repr shows fields
    assert config.s3_secret_access_key == "SUPERSECRET"


@pytest.mark.parametrize("raw,expected", [("true", True), ("FALSE", False), ("1", True), ("0", False)])
def test_auto_create_topics_reads_booleans(load, raw, expected):
    assert load(env={"LLOG_AUTO_CREATE_TOPICS": raw}).auto_create_topics is expected


@pytest.mark.parametrize("env,problem", [
    ({"LLOG_AUTO_CREATE_TOPICS": "maybe"}, "LLOG_AUTO_CREATE_TOPICS='maybe' is not a valid bool"),
    ({"LLOG_DEFAULT_PARTITIONS": "0"}, "LLOG_DEFAULT_PARTITIONS=0 must be >= 1"),
    ({"LLOG_RETENTION_MS": "-2"}, "LLOG_RETENTION_MS=-2 must be >= -1"),
])
def test_topic_defaults_are_checked(load, env, problem):
    with pytest.raises(ConfigError, match=re.escape(problem)):
        load(env=env)


# --- TOML config file ($LLOG_CONFIG_FILE) ----------------------------------------------------------


def test_config_file_sits_between_env_and_settings_file(load):
    toml = 'LLOG_S3_BUCKET = "file-bucket"\nLLOG_ROOT_PREFIX = "file/prefix"\nLLOG_S3_MAX_ATTEMPTS = 7\n'
    config = load(env={"LLOG_S3_BUCKET": "env-bucket", "AWS_REGION": "eu-west-1"},
                  settings={"LLOG_ROOT_PREFIX": "settings/prefix", "LLOG_S3_ENDPOINT_URL": "http://s:8333"},
                  toml=toml)
    assert (config.s3_bucket, config.root_prefix, config.s3_max_attempts) == ("env-bucket", "file/prefix", 7)
    assert (config.s3_endpoint_url, config.s3_region_name) == ("http://s:8333", "eu-west-1")


def test_config_file_types(load):
    config = load(toml='LLOG_S3_TIMEOUT_S = 3\nLLOG_AUTO_CREATE_TOPICS = false\nLLOG_BATCH_MAX_BYTES = 1_024\n'
                       'LLOG_TOPIC_CONFIG = \'{"t": {"compression.type": "zstd"}}\'\n')
    assert config.s3_timeout_s == 3.0 and isinstance(config.s3_timeout_s, float)
    assert (config.auto_create_topics, config.batch_max_bytes, config.compression("t")) == (False, 1024, "zstd")


def test_config_file_empty_string_is_unset(load):
    assert load(toml='LLOG_S3_BUCKET = ""\n', settings={"LLOG_S3_BUCKET": "from-settings"}).s3_bucket == "from-settings"


def test_config_file_is_not_an_option(load):
    with pytest.raises(ConfigError, match="unknown llog option"):
        load(options={CONFIG_FILE_ENV: "/etc/llog.toml"})


@pytest.mark.parametrize("toml,problem", [
    ('LLOG_S3_BUKKET = "b"\n', "unknown key 'LLOG_S3_BUKKET'; known keys: LLOG_OXIA_SERVICE_ADDRESS, "),
    ('s3_bucket = "b"\n', "unknown key 's3_bucket' (keys are LLOG_* names: did you mean LLOG_S3_BUCKET?)"),
    ('[LLOG]\nS3_BUCKET = "b"\n', "unknown key 'LLOG'"),
    ('LLOG_S3_MAX_ATTEMPTS = "5"\n', "LLOG_S3_MAX_ATTEMPTS = '5' must be a TOML integer"),
    ("LLOG_S3_MAX_ATTEMPTS = 2.5\n", "LLOG_S3_MAX_ATTEMPTS = 2.5 must be a TOML integer"),
    ("LLOG_S3_MAX_ATTEMPTS = true\n", "LLOG_S3_MAX_ATTEMPTS = True must be a TOML integer"),
    ('LLOG_S3_TIMEOUT_S = "fast"\n', "LLOG_S3_TIMEOUT_S = 'fast' must be a TOML number"),
    ('LLOG_AUTO_CREATE_TOPICS = "yes"\n', "LLOG_AUTO_CREATE_TOPICS = 'yes' must be a TOML boolean"),
    ("LLOG_S3_BUCKET = 7\n", "LLOG_S3_BUCKET = 7 must be a TOML string"),
    ('LLOG_S3_BUCKET = ["a"]\n', "LLOG_S3_BUCKET = ['a'] must be a TOML string"),
    ("LLOG_S3_MAX_ATTEMPTS = 0\n", "LLOG_S3_MAX_ATTEMPTS=0 must be >= 1"),
    ('LLOG_BROKER_ROLE = "all"\n', "LLOG_BROKER_ROLE='all' must be write, read or both"),
    ("LLOG_S3_BUCKET = b\n", "cannot read llog config file"),
])
def test_bad_config_file_names_the_file_and_key(load, tmp_path, toml, problem):
    with pytest.raises(ConfigError, match=re.escape(problem)) as info:
        load(toml=toml)
    assert str(tmp_path / "llog.toml") in str(info.value)


def test_bad_value_in_config_file_is_refused_even_when_the_env_overrides_it(load):
    with pytest.raises(ConfigError, match="llog config file .*LLOG_S3_MAX_ATTEMPTS=0"):
        load(env={"LLOG_S3_MAX_ATTEMPTS": "3"}, toml="LLOG_S3_MAX_ATTEMPTS = 0\n")


def test_missing_config_file_is_an_error(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=re.escape(f"cannot read llog config file {path} ($LLOG_CONFIG_FILE)")):
        Config.load(env={CONFIG_FILE_ENV: str(path)}, settings_path=tmp_path / "settings.json")


def test_empty_config_file_variable_reads_no_file(load):
    assert load(env={CONFIG_FILE_ENV: ""}) == Config()


# --- the example file ----------------------------------------------------------------------------


def test_every_field_is_documented():
    docs = field_docs()
    assert set(docs) == set(ENV_NAMES)
    assert all(len(doc) > 20 for doc in docs.values())
    assert docs["oxia_request_timeout_ms"] == "Deadline of one Oxia request; the client library has none of its own."


def test_example_lists_every_setting_once_at_its_default():
    text = example_toml()
    for field_name, env_name in ENV_NAMES.items():
        assert len(re.findall(rf"^# {env_name} = ", text, flags=re.M)) == 1, env_name
    assert "# LLOG_OXIA_SESSION_TIMEOUT_MS = 30_000\n" in text and '# LLOG_S3_BUCKET = ""\n' in text
    assert "# LLOG_S3_TIMEOUT_S = 60.0\n" in text and "# LLOG_AUTO_CREATE_TOPICS = true\n" in text


def test_example_loads_as_the_defaults(load):
    assert load(toml=example_toml()) == Config()


def test_example_uncommented_loads_as_the_defaults(load):
    """Every setting set to the value the example shows: proves each shown default is Config()'s."""
    uncommented = re.sub(r"^# (LLOG_\w+ = )", r"\1", example_toml(), flags=re.M)
    assert len(re.findall(r"^LLOG_", uncommented, flags=re.M)) == len(ENV_NAMES)
    assert load(toml=uncommented) == Config()
