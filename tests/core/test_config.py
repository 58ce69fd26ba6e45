"""Broken config and mapping files: every problem named with its file, key and what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.commands.main import main
from bridge.config import load_config, mask_url
from bridge.errors import ConfigError

GOOD_JOB = """
[[jobs]]
name = "j"
source = { system = "nginn", connection = "legacy", queues = ["MQueue1"], timezone = "Europe/Warsaw" }
target = { connection = "nsb", flavor = "postgresql" }
mapping = "m.toml"
"""
CONNECTIONS = '[connections]\nlegacy = "sqlite:///l.db"\nnsb = "sqlite:///n.db"\n'
MAPPING = '[routes]\n"*" = "Orders"\n'


def write(tmp: Path, config: str, mapping: str = MAPPING) -> Path:
    (tmp / "m.toml").write_text(mapping)
    p = tmp / "c.toml"
    p.write_text(config)
    return p


def problems(tmp: Path, config: str, mapping: str = MAPPING) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp, config, mapping))
    return str(e.value)


def test_good_config_loads(tmp_path: Path) -> None:
    c = load_config(write(tmp_path, CONNECTIONS + GOOD_JOB))
    assert c.jobs[0].target.schema_name == "public" and c.mapping(c.jobs[0]).route(["x"]) == "Orders"


@pytest.mark.parametrize("edit, expected", [
    (lambda s: s.replace('flavor = "postgresql"', 'flavor = "oracle"'), "jobs[0].target.flavor"),
    (lambda s: s.replace('queues = ["MQueue1"], ', ""), "jobs[0].source.queues: required key is missing"),
    (lambda s: s.replace('connection = "legacy"', 'connection = "nope"'), "jobs[0].source.connection: 'nope' is not in [connections]"),
    (lambda s: s.replace(', timezone = "Europe/Warsaw"', ""), "jobs[0].source.timezone: required for nginn"),
    (lambda s: s.replace("Europe/Warsaw", "Europe/Warsw"), "unknown time zone 'Europe/Warsw'"),
    (lambda s: s.replace('name = "j"', 'name = "j"\nbatchsize = 5'), "jobs[0].batchsize: unknown key"),
    (lambda s: s.replace('["MQueue1"]', '["Orders]; DROP TABLE x;--"]'), "contains a quote, bracket, semicolon"),
    (lambda s: s.replace('mapping = "m.toml"', 'mapping = "missing.toml"'), "jobs[0].mapping: file 'missing.toml' not found"),
    (lambda s: s + "\n[[jobs\n", "not valid TOML"),
])
def test_config_errors_are_located(tmp_path: Path, edit, expected: str) -> None:
    text = problems(tmp_path, edit(CONNECTIONS + GOOD_JOB))
    assert "c.toml" in text and expected in text


@pytest.mark.parametrize("mapping, expected", [
    ("[routes]\n", "[routes] is empty"),
    ('[routes]\n"*" = "Orders"\n[states]\nready = "trash"\n', "states.ready"),
    ('[routes]\n"*" = "Orders"\n[headers.set]\n"X" = "{nope}"\n', "unknown placeholder {nope}"),
    ('[routez]\n"*" = "Orders"\n', "routez: unknown key"),
])
def test_mapping_errors_name_the_mapping_file(tmp_path: Path, mapping: str, expected: str) -> None:
    text = problems(tmp_path, CONNECTIONS + GOOD_JOB, mapping)
    assert "m.toml" in text and expected in text


def test_environment_expansion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QB_TEST_URL", "sqlite:///from-env.db")
    cfg = CONNECTIONS.replace('"sqlite:///l.db"', '"${QB_TEST_URL}"').replace('"sqlite:///n.db"', '"${QB_UNSET_VAR:-sqlite:///default.db}"')
    c = load_config(write(tmp_path, cfg + GOOD_JOB))
    assert c.connections == {"legacy": "sqlite:///from-env.db", "nsb": "sqlite:///default.db"}
    monkeypatch.delenv("QB_TEST_URL")
    assert "environment variable QB_TEST_URL is not set" in problems(tmp_path, cfg + GOOD_JOB)


def test_passwords_are_masked() -> None:
    assert "s3cret" not in mask_url("postgresql+psycopg://bridge:s3cret@db.example/nsb")
    assert "***" in mask_url("postgresql+psycopg://bridge:s3cret@db.example/nsb")


def test_cli_exits_2_on_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, CONNECTIONS + GOOD_JOB.replace("postgresql", "oracle"))
    assert main(["verify", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert "config error" in err and "jobs[0].target.flavor" in err and "Traceback" not in err


def test_shipped_mappings_validate() -> None:
    from bridge.mapping import load_mapping

    root = Path(__file__).resolve().parents[2]
    for path in (root / "mappings").glob("*.toml"):
        assert load_mapping(path).routes, path
