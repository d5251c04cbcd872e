#!/usr/bin/env python3
"""Does this Python environment hold exactly what a lock export pins?

    python scripts/check-installed.py requirements/dev.txt            # every pin installed at its version
    python scripts/check-installed.py --exact requirements/runtime.txt # ... and nothing else (the image)

A pin whose environment marker does not apply here is skipped. With --exact, a distribution the
lock does not name is a difference too, except pip, setuptools (a 3.11 venv brings one) and the
project itself. Prints one line per difference and exits 1 if there is any. Standard library and
pip's own vendored `packaging` only, so it runs in the image as it is (deploy/smoke.sh) as well as
in tests/test_lock.py.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # the image has no packaging of its own: pip carries one
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]

ALWAYS_ALLOWED = {"pip", "setuptools", "mcp-recovery-proxy"}


def pins(path: str) -> list[Requirement]:
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    return [Requirement(line.removesuffix("\\").strip()) for line in lines if line and not line.startswith(("#", "--"))]


def differences(path: str, *, exact: bool) -> list[str]:
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    wanted: set[str] = set()
    out = []
    for req in pins(path):
        if req.marker is not None and not req.marker.evaluate():
            continue
        name = canonicalize_name(req.name)
        wanted.add(name)
        have = installed.get(name)
        if have is None:
            out.append(f"missing   {name} (lock {req.specifier})")
        elif not req.specifier.contains(have, prereleases=True):
            out.append(f"version   {name} {have} (lock {req.specifier})")
    if exact:
        for name in sorted(installed.keys() - wanted - ALWAYS_ALLOWED):
            out.append(f"unlocked  {name} {installed[name]}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lock", help="a requirements export of uv.lock (requirements/*.txt)")
    parser.add_argument("--exact", action="store_true", help="also report what the lock does not name")
    args = parser.parse_args()
    found = differences(args.lock, exact=args.exact)
    for line in found:
        print(line)
    if not found:
        print(f"this environment holds {args.lock}'s pins" + (" and nothing else" if args.exact else ""))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
