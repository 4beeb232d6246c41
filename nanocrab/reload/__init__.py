"""Hot reload: configuration snapshots, their validation and the versioned view handlers read.

* :mod:`.snapshot` — the configuration directory as one content-addressed snapshot (version =
  sha256 of its canonical bytes) and diffs between snapshots;
* :mod:`.validate` — a snapshot checked in isolation with the real loaders (file:line problems);
* :mod:`.loaded` — a snapshot turned into the objects handlers use (policy, guardrails chain
  config, agents, skill library);
* :mod:`.view` — :class:`ConfigView`, the per-process versioned view fed by the switch events
  (``reload.activated`` / ``reload.rolled_back``) of the log;
* :mod:`.health` — the pure health watch that decides an automatic rollback.

Imports events and bus, and the loaders beside handlers (policy, guardrails, routing, skills);
never handlers or cli.
"""

from nanocrab.reload.health import HealthOptions, HealthWatch, Verdict
from nanocrab.reload.loaded import BaseConfig, LoadedConfig, load_config
from nanocrab.reload.snapshot import CONFIG_FILES, Snapshot, collect, diff
from nanocrab.reload.validate import validate
from nanocrab.reload.view import ConfigView, pinned, pinned_version

__all__ = [
    "CONFIG_FILES",
    "BaseConfig",
    "ConfigView",
    "HealthOptions",
    "HealthWatch",
    "LoadedConfig",
    "Snapshot",
    "Verdict",
    "collect",
    "diff",
    "load_config",
    "pinned",
    "pinned_version",
    "validate",
]
