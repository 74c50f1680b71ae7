"""floodwall: a sidecar proxy that gives AMQP brokers per-queue producer flow control."""

__version__ = "0.1.0"
