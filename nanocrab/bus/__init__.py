"""The JetStream bus: embedded server, streams, appends, handler runtime, replay, tracing."""

from nanocrab.bus.config import BusConfig
from nanocrab.bus.connection import connect, ensure_streams
from nanocrab.bus.connector import Connector
from nanocrab.bus.errors import (
    AppendConflict,
    AppendRejected,
    AuthenticationFailed,
    BusError,
    PublishRefused,
    ServerStartError,
    TransientError,
)
from nanocrab.bus.log import Appended, EventLog, Expect, RawMessage, append_traced
from nanocrab.bus.reactions import stamp
from nanocrab.bus.reactor import Delivery, Reaction, Reactor
from nanocrab.bus.replay import Stored, Window, read, read_run
from nanocrab.bus.runtime import HandlerRuntime, RuntimeOptions
from nanocrab.bus.server import EmbeddedServer, server_binary
from nanocrab.bus.subjects import Subjects, sanitize_token

__all__ = [
    "AppendConflict",
    "AppendRejected",
    "Appended",
    "AuthenticationFailed",
    "BusConfig",
    "BusError",
    "Connector",
    "Delivery",
    "EmbeddedServer",
    "EventLog",
    "Expect",
    "HandlerRuntime",
    "PublishRefused",
    "RawMessage",
    "Reaction",
    "Reactor",
    "RuntimeOptions",
    "ServerStartError",
    "Stored",
    "Subjects",
    "TransientError",
    "Window",
    "append_traced",
    "connect",
    "ensure_streams",
    "read",
    "read_run",
    "sanitize_token",
    "server_binary",
    "stamp",
]  # fmt: skip
