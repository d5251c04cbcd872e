#!/usr/bin/env bash
# Debian's redis-server for the shared-state tests (tests/state): idempotent. The tests start
# their own server on a free loopback port (--save '' --appendonly no) and stop it by its pid;
# a system service that Debian may start on install is left alone (it listens on 6379, unused).
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
    redis-server --version
    exit 0
fi
SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update -q
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server
redis-server --version
