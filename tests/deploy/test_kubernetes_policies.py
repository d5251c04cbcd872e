"""The Kubernetes example's policy folder (deploy/kubernetes/policies-configmap.yaml) is the shipped
one: its defaults resolve to the same policy as policies/defaults.yaml, and its refund.yaml to the
same as policies/examples/refund.yaml. A ConfigMap left behind when the shipped defaults change
would give a Kubernetes deployment timers the image and compose no longer have."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import yaml

from proxy.policy.compile import load_policy_dir

REPO = Path(__file__).resolve().parents[2]
CONFIGMAP = REPO / "deploy" / "kubernetes" / "policies-configmap.yaml"


def _settings(policy: object) -> dict[str, object]:
    """A resolved policy's settings, without where each came from (`sources`: file names)."""
    names = [f.name for f in dataclasses.fields(policy) if f.name != "sources"]  # type: ignore[arg-type]
    return {name: getattr(policy, name) for name in names}


def test_the_configmaps_policies_resolve_as_the_shipped_ones(tmp_path: Path) -> None:
    files = yaml.safe_load(CONFIGMAP.read_text())["data"]
    assert set(files) == {"defaults.yaml", "refund.yaml"}
    mapped = tmp_path / "configmap"
    mapped.mkdir()
    for name, text in files.items():
        (mapped / name).write_text(text)
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    shutil.copy(REPO / "policies" / "defaults.yaml", shipped / "defaults.yaml")
    shutil.copy(REPO / "policies" / "examples" / "refund.yaml", shipped / "refund.yaml")
    ours, theirs = load_policy_dir(mapped), load_policy_dir(shipped)
    for tool, hints in [("refund", None), ("search_orders", {"readOnlyHint": True}), ("anything", None)]:
        assert _settings(ours.resolve(tool, hints)) == _settings(theirs.resolve(tool, hints)), tool
