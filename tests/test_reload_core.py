"""The pure parts of hot reload (snapshots, validation, the health watch) and the view's exact
``version_at`` on a real log."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import Delivery, EventLog
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.events import (
    ReloadActivated,
    ReloadRolledBack,
    RouteDecided,
    TaskSubmitted,
    new_event_id,
)
from nanocrab.handlers.router import RouterHandler
from nanocrab.reload import HealthOptions, HealthWatch, Snapshot, collect, diff, validate
from nanocrab.reload.snapshot import relevant
from nanocrab.reload.view import SNAPSHOT_NAME
from nanocrab.routing import parse_agents

from .reload_rig import OPEN_POLICY_YAML, make_view, skill_md, write_config


def test_a_snapshot_is_content_addressed_and_holds_only_configuration(tmp_path: Path) -> None:
    write_config(tmp_path, greet=skill_md("greet", "Greets.", "Hi."))
    (tmp_path / "nats").mkdir()
    (tmp_path / "nats" / "store.dat").write_text("not configuration")
    (tmp_path / "skills" / ".hidden").mkdir()
    (tmp_path / "skills" / ".hidden" / "x").write_text("no")
    snap = collect(tmp_path)
    assert sorted(snap.files) == ["policy.yaml", "skills/greet/SKILL.md"]
    assert Snapshot.decode(snap.encode()) == snap
    assert collect(tmp_path).version == snap.version
    (tmp_path / "policy.yaml").write_text(OPEN_POLICY_YAML + "# a comment\n")
    changed, text = diff(snap, collect(tmp_path))
    assert changed == ["policy.yaml"] and "+# a comment" in text
    assert collect(tmp_path).version != snap.version


def test_the_watcher_passes_configuration_changes_and_not_the_data_beside_them(
    tmp_path: Path,
) -> None:
    real = tmp_path / "real"
    write_config(real)
    (real / "agents.yaml").write_text("agents:\n  - name: a\n    module: agents/a.py\n")
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    for config in (real, link):  # watched by its own name or through a symbolic link
        for name in ("policy.yaml", "guardrails.yaml", "skills/x/SKILL.md", "agents/a.py"):
            assert relevant(config, str(config / name)), name
        for name in ("traces.jsonl", "projections.db-wal", "agents/b.py", ".git/HEAD", "x.yaml"):
            assert not relevant(config, str(config / name)), name
    # a change reported under the other spelling of the same directory still counts
    assert relevant(link, str(real / "policy.yaml"))
    assert not relevant(link, str(tmp_path / "elsewhere" / "policy.yaml"))


def test_a_valid_directory_has_no_problems_and_each_loader_reports_file_and_line(
    tmp_path: Path,
) -> None:
    write_config(tmp_path, greet=skill_md("greet", "Greets.", "Hi."))
    assert validate(collect(tmp_path)) == []
    (tmp_path / "guardrails.yaml").write_text("version: 1\nfilters:\n  - id: x\n    kind: nope\n")
    (tmp_path / "agents.yaml").write_text("version: 1\nagents:\n  - name: Bad Name\n")
    problems = {p.file: p for p in validate(collect(tmp_path))}
    assert set(problems) == {"guardrails.yaml", "agents.yaml"}
    assert all(p.line > 0 for p in problems.values()), problems


def test_the_health_watch_rolls_back_once_past_the_threshold_within_the_window() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    watch = HealthWatch(HealthOptions(threshold=0.5, min_runs=3, window_s=60))
    watch.activated("v2", "v1", t0)
    assert watch.ended("v1", True, t0) is None  # another version's run never counts
    assert watch.ended("v2", True, t0) is None
    assert watch.ended("v2", False, t0) is None  # 1 of 2: not enough runs yet
    verdict = watch.ended("v2", True, t0 + timedelta(seconds=10))
    assert verdict is not None and (verdict.from_version, verdict.to_version) == ("v2", "v1")
    assert (verdict.runs, verdict.failed) == (3, 2)
    watch.rolled("v2")
    assert watch.ended("v2", True, t0) is None

    late = HealthWatch(HealthOptions(threshold=0.5, min_runs=1, window_s=60))
    late.activated("v3", "v2", t0)
    assert late.ended("v3", True, t0 + timedelta(seconds=61)) is None  # survived its window


async def test_two_views_agree_on_the_version_at_every_position_whatever_they_have_seen(
    log: EventLog, tmp_path: Path
) -> None:
    store = JetStreamArtifacts(log)
    versions = []
    for body in ("one", "two"):
        write_config(tmp_path / body, greet=skill_md("greet", "Greets.", body))
        snap = collect(tmp_path / body)
        await store.put(SNAPSHOT_NAME, snap.encode())
        versions.append(snap.version)
    early = make_view(log, tmp_path / "early")
    await early.ready()  # follows the log from here on
    seqs: list[int] = []

    async def task() -> None:
        rid = new_event_id()
        seqs.append((await log.append(TaskSubmitted(text="t", run_id=rid))).seq)

    await task()
    a1 = await log.append(ReloadActivated(version=versions[0], source="reloader"))
    await task()
    a2 = await log.append(ReloadActivated(version=versions[1], previous=versions[0],
                                          source="reloader"))  # fmt: skip
    await task()
    await log.append(ReloadRolledBack(version=versions[0], from_version=versions[1],
                                      reason="test", source="reloader"))  # fmt: skip
    await task()
    late = make_view(log, tmp_path / "late")  # started after every switch
    expected = ["", versions[0], versions[1], versions[0]]
    for view in (late, early):
        assert [await view.version_at(s) for s in seqs] == expected
    assert await early.version_at(a1.seq) == "" and await early.version_at(a2.seq) == versions[0]
    assert late.active == early.active == versions[0]
    assert late.get(versions[1]).skills.body("greet") == "two"
    await early.stop()
    await late.stop()


class Words:
    """A toy embedder: counts of a few words (and a constant), normalised."""

    model_id = "test-words"
    VOCAB = ("code", "mail", "poems")
    dim = len(VOCAB) + 1

    def embed(self, texts: Sequence[str]) -> np.ndarray:  # type: ignore[type-arg]
        rows = []
        for text in texts:
            words = text.lower().split()
            v = np.array([*(float(w in words) for w in self.VOCAB), 0.01], dtype=np.float32)
            rows.append(v / np.linalg.norm(v))
        return np.array(rows, dtype=np.float32).reshape(len(texts), self.dim)


AGENTS_V1 = """\
version: 1
default: coder
agents:
  - name: coder
    description: writes code
  - name: poet
    description: writes poems
"""


async def test_the_router_routes_among_the_agents_of_the_version_active_at_the_task(
    log: EventLog, sqlite_engine: AsyncEngine, tmp_path: Path
) -> None:
    startup = parse_agents(
        "version: 1\ndefault: coder\nagents:\n  - name: coder\n    description: writes code\n"
        "  - name: mailer\n    description: reads mail\n"
    )
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "agents.yaml").write_text(AGENTS_V1)
    snap = collect(tmp_path / "v1")
    await JetStreamArtifacts(log).put(SNAPSHOT_NAME, snap.encode())
    view = make_view(log, tmp_path / "cache")
    words = Words()
    router = RouterHandler(log, sqlite_engine, config=startup, embedder=lambda: words,
                           versions=view)  # fmt: skip

    async def routed() -> str:
        rid = new_event_id()
        task = TaskSubmitted(text="poems please", run_id=rid, task_id=rid)
        stored = await log.append(task)
        out = await router.handle(task, Delivery(seq=stored.seq, subject=stored.subject))
        (decided,) = [e for e in out if isinstance(e, RouteDecided)]
        return decided.agent

    assert await routed() == "coder"  # the start-up agents: no poet, the default
    await log.append(ReloadActivated(version=snap.version, source="reloader"))
    assert await routed() == "poet"
    await view.stop()
