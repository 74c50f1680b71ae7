# floodwall: the sidecar image. Build from the repository root:
#     docker build -t floodwall:0.1.0 .
# The package is installed the way `make test` installs it: pip from this repository's
# pyproject.toml (same dependency spec), here into a virtualenv that the final stage copies.

# --- builder: has a compiler, in case a dependency has no wheel for this platform ----------
FROM python:3.11-bookworm AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/floodwall
ENV PATH=/opt/floodwall/bin:$PATH

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY proxy ./proxy
# `make test` runs `pip install -e '.[test,demo]'`; the image takes the same package, no extras.
RUN pip install --no-cache-dir . \
    && floodwall --version

# --- final: slim, no compiler, non-root ------------------------------------------------
FROM python:3.11-slim-bookworm

LABEL org.opencontainers.image.title="floodwall" \
      org.opencontainers.image.description="Per-queue producer flow control for AMQP brokers, as a sidecar proxy" \
      org.opencontainers.image.licenses="Apache-2.0"

RUN groupadd --system --gid 10001 floodwall \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/floodwall \
       --no-create-home --shell /usr/sbin/nologin floodwall \
    && mkdir -p /var/lib/floodwall/spool /var/lib/floodwall/telemetry /etc/floodwall \
    && chown -R 10001:10001 /var/lib/floodwall

COPY --from=builder /opt/floodwall /opt/floodwall
COPY policies/example.yaml policies/schema.json /etc/floodwall/examples/

# Every flag has a FLOODWALL_* variable (README "Run it"). FLOODWALL_SPOOL_DIR and
# FLOODWALL_TELEMETRY_DIR name the volumes for the spool and telemetry writers (DESIGN.md).
ENV PATH=/opt/floodwall/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    FLOODWALL_LISTEN=0.0.0.0:5673 \
    FLOODWALL_ADMIN=0.0.0.0:9090 \
    FLOODWALL_DRAIN_TIMEOUT=30s \
    FLOODWALL_SPOOL_DIR=/var/lib/floodwall/spool \
    FLOODWALL_TELEMETRY_DIR=/var/lib/floodwall/telemetry

VOLUME ["/var/lib/floodwall/spool", "/var/lib/floodwall/telemetry"]
USER 10001:10001
WORKDIR /var/lib/floodwall
EXPOSE 5673 5671 9090

# TLS (README "TLS"): FLOODWALL_UPSTREAM=amqps://..., FLOODWALL_UPSTREAM_TLS_CA/_CERT/_KEY,
# FLOODWALL_LISTEN_TLS with FLOODWALL_LISTEN_TLS_CERT/_KEY/_CLIENT_CA, files mounted from
# Secrets (the root filesystem stays read-only: nothing is written for TLS). The admin
# endpoint stays plain HTTP, so the HEALTHCHECK below and the chart's probes work unchanged.
# No curl in slim: Python asks /healthz on the admin port that FLOODWALL_ADMIN names.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('FLOODWALL_ADMIN', '0.0.0.0:9090').rpartition(':')[2]; urllib.request.urlopen('http://127.0.0.1:' + port + '/healthz', timeout=2)"]

# SIGTERM drains (FLOODWALL_DRAIN_TIMEOUT); the orchestrator's grace period must be longer.
STOPSIGNAL SIGTERM
ENTRYPOINT ["floodwall", "run"]
