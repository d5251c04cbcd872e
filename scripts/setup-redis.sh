#!/usr/bin/env bash
# Debian's redis-server for the shared-state tests (tests/state): idempotent. The tests start
# their own servers on free loopback ports (--save '' --appendonly no), plain, TLS-only
# (rediss://) and as a three-master cluster (redis-cli --cluster create), and stop them by pid;
# a system service that Debian may start on install is left alone (it listens on 6379, unused).
set -euo pipefail
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -q
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server redis-tools
fi
redis-server --version
redis-cli --version
# The TLS tests need a server built with TLS: such a server accepts --tls-port (and, listening
# nowhere, exits at once saying so); one without it rejects the option as a configuration error.
probe="$(redis-server --port 0 --tls-port 0 --save '' 2>&1 || true)"
if [[ "$probe" != *"not listen anywhere"* ]]; then
    echo "setup-redis: this redis-server was built without TLS (the rediss:// tests need it)" >&2
    exit 1
fi
