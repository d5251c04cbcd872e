"""Memory of what `policies suggest` reads (proxy/telemetry/observed.py) under a flood: within its bound.

Method: one `ObservedTools`, the observer the admin port runs, fed the events the engine emits,
in-process (what is measured is the structure's memory, not a transport): a flood of distinct
tool names (each with a success, a timer cut and a matched rule), of distinct unclassified error
texts (long, differing beyond their digits) and of distinct rule names, far past every bound.
`tracemalloc` measures what the observer holds afterwards (its snapshot dropped), against the
bound its contract states by construction, and against a baseline of one tool seen once, in the
same run. Printed: events fed, tools, texts and rules kept and dropped, bytes held, the bound.

    .venv/bin/python bench/observed.py                   # 2,000 tools x 50 texts x 50 rules
    .venv/bin/python bench/observed.py --tools 500 --texts 200 --rules 100
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.telemetry.events import AttemptFinished, CallReported, CallSucceeded
from proxy.telemetry.observed import (
    BUCKET_COUNT,
    MAX_RULES,
    MAX_TEXTS,
    MAX_TOOLS,
    NAME_LIMIT,
    TEXT_LIMIT,
    ObservedTools,
)

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
# a generous constant per entry on CPython 3.11 (a dict slot, a small object and its counters)
PER_ENTRY_BYTES = 512


def report(text: str) -> dict[str, Any]:
    return {
        "classification": {"defaulted": True, "code": None},
        "attemptedSteps": [{"outcome": "tool_error", "detail": text}],
    }


def feed(observed: ObservedTools, tools: int, texts: int, rules: int) -> int:
    events = 0
    for t in range(tools):
        tool = f"tool-{t}-" + "n" * 200  # longer than a name is kept
        observed.on_event(CallSucceeded("c", tool, 0.01 * (t % 50 + 1), 0.02))
        observed.on_event(AttemptFinished("c", tool, 1, 30.0, "timeout", "transient", "unknown", "default"))
        events += 2
        for r in range(rules if t < MAX_TOOLS else 1):
            rule = f"rule-{r}-" + "r" * 300
            observed.on_event(AttemptFinished("c", tool, 1, 0.1, "tool_error", "transient", "yes", "rule", rule))
            events += 1
        for i in range(texts if t < MAX_TOOLS else 1):
            text = " ".join(WORDS[(i >> k) % len(WORDS)] for k in range(12)) + f" {i} " + "y" * 5_000
            observed.on_event(CallReported("c", tool, report(text)))
            events += 1
    return events


def held_bytes(tools: int, texts: int, rules: int) -> tuple[int, int, ObservedTools]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    observed = ObservedTools()
    events = feed(observed, tools, texts, rules)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return events, held, observed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tools", type=int, default=2000)
    ap.add_argument("--texts", type=int, default=50, help="distinct unclassified texts per tool")
    ap.add_argument("--rules", type=int, default=50, help="distinct rule names per tool")
    args = ap.parse_args()
    _, baseline, _ = held_bytes(1, 1, 1)
    events, held, observed = held_bytes(args.tools, args.texts, args.rules)
    snap = observed.snapshot()
    kept_texts = sum(len(t["texts"]) for t in snap["tools"])
    dropped_texts = sum(t["texts_dropped"] for t in snap["tools"])
    kept_rules = sum(len(t["rules_matched"]) for t in snap["tools"])
    # the contract's bound: per tool, the histogram's counters, two strings per text (key and
    # sample), the rule names, plus a constant per entry; characters are bytes here (ASCII)
    per_tool = (
        BUCKET_COUNT * 8 + MAX_TEXTS * (2 * TEXT_LIMIT + PER_ENTRY_BYTES) + MAX_RULES * (NAME_LIMIT + PER_ENTRY_BYTES)
    )
    bound = MAX_TOOLS * (per_tool + NAME_LIMIT + PER_ENTRY_BYTES)
    print(f"events fed: {events:,} ({args.tools:,} tools, {args.texts} texts and {args.rules} rules per tool)")
    print(f"tools kept {len(snap['tools'])} (limit {MAX_TOOLS}), dropped events of others {snap['dropped_tools']:,}")
    print(
        f"texts kept {kept_texts:,} (limit {MAX_TEXTS} per tool), dropped {dropped_texts:,}; rules kept {kept_rules:,}"
    )
    print(f"{'':<30} {'bytes held':>12}")
    print(f"{'baseline (one tool, once)':<30} {baseline:>12,}")
    print(f"{'after the flood':<30} {held:>12,}")
    print(f"{'bound by construction':<30} {bound:>12,}")
    within = held <= bound
    print("held within the bound:", "yes" if within else "NO")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
