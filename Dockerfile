# floodwall: the sidecar image. `make image` builds it (podman where installed, else docker;
# floodwall/dev/image.py); by hand, from the repository root:
#     docker build -t floodwall:0.1.0 .
#     podman build --build-arg BASE=localhost/floodwall-base:bookworm-... -t floodwall:0.1.0 .
#
# BASE: the one image both stages start from (the virtualenv links to its python3, so the
# builder's and the final stage's must be the same). Two kinds serve:
# - a registry's Python image, pinned by digest: the default below (python:3.11-slim-bookworm
#   as its index digest was when pinned; `skopeo inspect docker://python:3.11-slim-bookworm`
#   shows today's, to move the pin on purpose);
# - where no registry answers, Debian 12 made locally from Debian's own packages:
#   `mmdebstrap --variant=minbase --include=python3,python3-venv bookworm` (docs, manual
#   pages and translations left out) imported with `podman import`. A local image has no
#   registry digest: `make image` tags it by the hash of its recipe and records its image ID
#   in the floodwall image's labels (org.opencontainers.image.base.name: the tag,
#   org.opencontainers.image.base.digest: the ID) and in build/images/floodwall.json.
# The digest below could not be checked from the machine this was written on (no registry
# answers there); `skopeo inspect docker://docker.io/library/python@sha256:...` checks it.
ARG BASE=docker.io/library/python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

# --- builder: pip and the build backend live here only ------------------------------------
FROM ${BASE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY floodwall ./floodwall
# /opt/tools holds pip; /opt/floodwall (what the final stage copies) is made without pip and
# filled from outside (pip --python). The host's pip settings (a private index, a proxy's CA)
# reach this step as read-only build mounts (`podman build -v`) and a file of its PIP_*
# variables, /run/host-pip.env, when present: nothing of them stays in an image.
# `make test` runs `pip install -e '.[test,demo,pipeline]'`; the image takes the same package,
# no extras.
# hadolint ignore=SC1091
RUN if [ -f /run/host-pip.env ]; then set -a; . /run/host-pip.env; set +a; fi \
    && python3 -m venv /opt/tools \
    && python3 -m venv --without-pip /opt/floodwall \
    && /opt/tools/bin/pip --python /opt/floodwall/bin/python install --no-cache-dir . \
    && /opt/floodwall/bin/floodwall --version \
    && ! ls /opt/floodwall/bin/pip* 2>/dev/null

# --- runtime root: the base less what a sidecar never runs --------------------------------
FROM ${BASE} AS runtime-root
# Removed (the final stage copies what is left as one layer, so the removal saves the space):
# the package manager's tools and lists (/var/lib/dpkg/status stays: image scanners read it),
# perl (only dpkg's scripts use it), iconv modules, pip's wheels, documentation, manual pages
# and translations. The floodwall user (uid/gid 10001) is written into /etc/passwd and
# /etc/group directly: the same line on every base, no tool needed.
RUN rm -rf /usr/share/doc /usr/share/man /usr/share/info /usr/share/locale /usr/share/perl \
           /usr/share/perl5 /usr/lib/*-linux-gnu/perl /usr/lib/*-linux-gnu/perl-base \
           /usr/lib/*-linux-gnu/perl5 /usr/lib/*-linux-gnu/libperl.so* /usr/bin/perl* \
           /usr/lib/*-linux-gnu/gconv /usr/lib/apt /usr/lib/*-linux-gnu/libapt-* \
           /usr/bin/apt* /usr/share/python-wheels /var/lib/apt /var/cache/* /var/log/* \
    && echo "floodwall:x:10001:10001:floodwall:/var/lib/floodwall:/usr/sbin/nologin" >> /etc/passwd \
    && echo "floodwall:x:10001:" >> /etc/group \
    && mkdir -p /var/lib/floodwall/spool /var/lib/floodwall/telemetry /etc/floodwall/examples \
               /usr/share/doc/floodwall \
    && chown -R 10001:10001 /var/lib/floodwall

# --- final: one layer of files, no compiler, no pip, non-root ------------------------------
FROM scratch

LABEL org.opencontainers.image.title="floodwall" \
      org.opencontainers.image.description="Per-queue producer flow control for AMQP brokers, as a sidecar proxy" \
      org.opencontainers.image.licenses="Apache-2.0"

# The whole pruned root on purpose: a layer of the base cannot shrink, a copy of it can.
# hadolint ignore=DL3067
COPY --from=runtime-root / /
COPY --from=builder /opt/floodwall /opt/floodwall
COPY policies/example.yaml policies/schema.json /etc/floodwall/examples/
COPY LICENSE /usr/share/doc/floodwall/LICENSE

# Every flag has a FLOODWALL_* variable (docs/configuration.md). FLOODWALL_SPOOL_DIR and
# FLOODWALL_TELEMETRY_DIR name the volumes for the spool (overflow: spool) and the telemetry
# (docs/telemetry.md); both are used only with --policies (FLOODWALL_POLICIES).
# FLOODWALL_ADMIN: /metrics /healthz /readyz /state; kubelet probes and Prometheus reach it on
# the pod IP, so it listens on every address; the chart's admin.host narrows it and its
# NetworkPolicy (networkPolicy.enabled) limits who reaches it.
ENV PATH=/opt/floodwall/bin:/usr/local/bin:/usr/bin:/bin \
    LANG=C.UTF-8 \
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

# TLS (docs/configuration.md, "TLS"): FLOODWALL_UPSTREAM=amqps://..., FLOODWALL_UPSTREAM_TLS_CA/_CERT/_KEY,
# FLOODWALL_LISTEN_TLS with FLOODWALL_LISTEN_TLS_CERT/_KEY/_CLIENT_CA, files mounted from
# Secrets (the root filesystem stays read-only: nothing is written for TLS). The admin
# endpoint stays plain HTTP, so the HEALTHCHECK below and the chart's probes work unchanged.
# No curl: Python asks /healthz on the admin port that FLOODWALL_ADMIN names.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('FLOODWALL_ADMIN', '0.0.0.0:9090').rpartition(':')[2]; urllib.request.urlopen('http://127.0.0.1:' + port + '/healthz', timeout=2)"]

# SIGTERM drains (FLOODWALL_DRAIN_TIMEOUT); the orchestrator's grace period must be longer.
STOPSIGNAL SIGTERM
# `floodwall --version`, `floodwall check FILE` and the rest answer as given; no arguments
# runs the proxy (the chart passes `run` and its own arguments explicitly).
ENTRYPOINT ["floodwall"]
CMD ["run"]
