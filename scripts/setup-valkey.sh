#!/usr/bin/env bash
# A real valkey-server for the shared-state tests (tests/state, valkey://): idempotent.
#
# Valkey is not in Debian bookworm itself, but bookworm-backports carries it (valkey-tools, whose
# one binary is valkey-server and valkey-check-rdb, as redis-server's is). The package is fetched
# with apt from Debian's mirror through a private source list and package index under
# .cache/valkey/apt (the machine's own apt sources and state are not touched), and extracted into
# .cache/valkey (nothing is installed system-wide, so it cannot clash with redis-tools). Its
# libraries (jemalloc, lzf, OpenSSL) are those redis-server already brought in.
# The tests find .cache/valkey/usr/bin/valkey-server (or MCP_VALKEY_SERVER, or one on PATH).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$REPO_ROOT/.cache/valkey"
BIN="$DEST/usr/bin/valkey-server"
if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
    "$BIN" --version
    exit 0
fi
APT="$DEST/apt"
mkdir -p "$APT/lists/partial" "$APT/archives/partial"
echo "deb http://deb.debian.org/debian bookworm-backports main" >"$APT/sources.list"
OPTS=(-o "Dir::Etc::sourcelist=$APT/sources.list" -o "Dir::Etc::sourceparts=-"
      -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache::Archives=$APT/archives" -o "APT::Get::List-Cleanup=0")
apt-get "${OPTS[@]}" update -q
# jemalloc and lzf come with redis-server (scripts/setup-redis.sh runs first); name them anyway
# so a machine without them fails here, loudly, rather than at the first test.
for lib in libjemalloc2 liblzf1; do dpkg -s "$lib" >/dev/null 2>&1 || { echo "setup-valkey: $lib missing (install redis-server first)" >&2; exit 1; }; done
(cd "$APT/archives" && apt-get "${OPTS[@]}" download valkey-tools)
dpkg-deb -x "$APT"/archives/valkey-tools_*.deb "$DEST"
ln -sf valkey-check-rdb "$DEST/usr/bin/valkey-server"
"$BIN" --version
