"""nanocrab: an event-sourced agent runtime on NATS JetStream."""

__version__ = "0.1.0"
