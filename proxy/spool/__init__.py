"""Flow-to-disk: per-queue append-only segment logs of publishes, recovered and replayed."""
