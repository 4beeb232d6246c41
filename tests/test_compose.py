"""compose.yaml: valid against the Compose Specification, and the topology it promises.

Docker cannot pull images on this machine, so the file is checked, not run: against the
Compose Specification JSON schema (tests/data/compose-spec.json, the copy the docker-compose
1.29.2 wheel ships as compose/config/compose_spec.json, Apache-2.0), and for what the
deployment needs — three routed NATS nodes with the generated authorization, PostgreSQL, every
handler a scalable service holding only its own seed. ``nanocrab cluster config`` writes the
files it mounts, and nats-server itself (``-t``) checks the node configurations. The same
topology runs as processes in tests/test_scale_failover.py.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from nanocrab.bus import server_binary
from nanocrab.cli import app
from nanocrab.cli.provision import HOST_IDENTITIES

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((Path(__file__).parent / "data" / "compose-spec.json").read_text())


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return doc


def errors(doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft201909Validator(SCHEMA)
    return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(doc)]


def test_compose_yaml_is_valid_against_the_compose_specification() -> None:
    jsonschema.Draft201909Validator.check_schema(SCHEMA)
    assert errors(compose()) == []


def test_the_schema_check_rejects_a_misspelt_key_and_an_unknown_condition() -> None:
    doc = copy.deepcopy(compose())
    doc["services"]["executor"]["comand"] = ["handler", "executor"]
    doc["services"]["policy"]["depends_on"] = {"setup": {"condition": "service_done"}}
    found = errors(doc)
    assert any("executor" in e and "comand" in e for e in found), found
    assert any("services.policy.depends_on" in e for e in found), found


def test_three_routed_nats_nodes_postgres_and_a_service_per_handler() -> None:
    services = compose()["services"]
    for i in (1, 2, 3):
        node = services[f"nats-{i}"]
        assert node["image"].startswith("nats:")
        mounts = node["volumes"]
        assert f"./deploy/nats/nats-{i}.conf:/etc/nats/nats.conf:ro" in mounts
        assert "./deploy/nats/auth.conf:/etc/nats/auth.conf:ro" in mounts
        assert node["command"] == ["-c", "/etc/nats/nats.conf"]
    assert services["postgres"]["image"].startswith("postgres:")
    for name in HOST_IDENTITIES:
        svc = services[name]
        assert svc["command"] == ["handler", name]
        # scalable with --scale: no fixed container name, no host port
        assert "container_name" not in svc and "ports" not in svc
        assert f"./deploy/keys/{name}:/var/lib/nanocrab/keys:ro" in svc["volumes"]
        env = svc["environment"]
        assert env["NANOCRAB_STREAM_REPLICAS"] == "3"
        assert env["NANOCRAB_NATS_AUTH"] == "nkeys"
        assert env["NANOCRAB_NATS_URL"].count("nats://") == 3
        assert env["NANOCRAB_DB_URL"].startswith("postgresql+asyncpg://")
        assert svc["depends_on"]["setup"]["condition"] == "service_completed_successfully"
    assert services["setup"]["command"] == ["cluster", "setup"]


def test_cluster_config_writes_every_mounted_file_and_nats_accepts_the_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NANOCRAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("NANOCRAB_NATS_URL", raising=False)
    deploy = tmp_path / "deploy"
    result = CliRunner().invoke(app, ["cluster", "config", str(deploy)])
    assert result.exit_code == 0, result.output
    for svc in compose()["services"].values():
        for mount in svc.get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith("./deploy/"):
                assert (deploy / source.removeprefix("./deploy/")).exists(), source
    # an executor host can check a grant, not mint one
    executor = sorted(p.name for p in (deploy / "keys" / "executor").iterdir())
    assert executor == ["approver.pub", "executor.nk", "policy.pub"]
    assert not any(
        p.suffix == ".nk" and p.stem != "admin" for p in (deploy / "keys/setup").iterdir()
    )
    auth = (deploy / "nats" / "auth.conf").read_text()
    assert auth.count("nkey: U") >= len(HOST_IDENTITIES)
    for i in (1, 2, 3):
        conf = (deploy / "nats" / f"nats-{i}.conf").read_text()
        assert conf.count("nats-route://") == 2 and f"//nats-{i}:" not in conf  # peers only
        checked = subprocess.run(
            [str(server_binary()), "-t", "-c", str(deploy / "nats" / f"nats-{i}.conf")],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert checked.returncode == 0, checked.stdout + checked.stderr
