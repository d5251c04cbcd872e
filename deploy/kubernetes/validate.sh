#!/usr/bin/env bash
# Offline validation of the Kubernetes sidecar example (no cluster, no schema downloads).
#
#   bash deploy/kubernetes/validate.sh
#
# 1. Built-in kinds (Deployment, Service, ConfigMap) against the API schemas that the PyPI package
#    kubernetes-validate carries, in strict mode (unknown fields fail), for every Kubernetes
#    version in K8S_VERSIONS.
# 2. The PodMonitor (a custom resource, no schema in kubernetes-validate) against the Prometheus
#    Operator's typed models from the PyPI package cloudcoil-models-prometheus-operator, generated
#    from the operator's CRDs: required fields, enums and patterns (e.g. interval) are checked, and
#    any key the model does not know is reported as unknown.
# 3. Cross-references a schema cannot see: kustomization resources exist and cover every manifest;
#    Service and PodMonitor selectors match the pod labels; named ports exist; probes hit the
#    admin port; the policies volume is mounted whole (subPath would break hot reload); the
#    allowed-hosts variable is a JSON list; the security context is hardened.
# 4. The ConfigMap's policy files with `mcp-recovery-proxy policies check`, when the project can be
#    imported (its .venv, or the command on PATH); skipped with a note otherwise.
#
# The tools go into a throwaway venv (KV_VENV, default a temporary directory), never the project's.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
versions=${K8S_VERSIONS:-"1.29.0 1.33.0 1.37.0"}
owned_venv=0
if [[ -z ${KV_VENV:-} ]]; then
  KV_VENV=$(mktemp -d "${TMPDIR:-/tmp}/kv-venv.XXXXXX")
  owned_venv=1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kv-check.XXXXXX")
cleanup() {
  rm -rf "$tmp"
  if [[ $owned_venv == 1 ]]; then rm -rf "$KV_VENV"; fi
}
trap cleanup EXIT

if [[ ! -x $KV_VENV/bin/kubernetes-validate ]]; then
  echo "---- installing kubernetes-validate and the Prometheus Operator models into $KV_VENV"
  python3 -m venv "$KV_VENV"
  "$KV_VENV/bin/pip" install --quiet --disable-pip-version-check \
    "kubernetes-validate==1.37.0" "cloudcoil-models-prometheus-operator==0.80.1.0" pyyaml
fi

builtin=()
for f in "$here"/*.yaml; do
  case $(basename "$f") in
    kustomization.yaml | podmonitor.yaml) ;;
    *) builtin+=("$f") ;;
  esac
done

status=0
for v in $versions; do
  echo "---- kubernetes-validate --strict -k $v"
  "$KV_VENV/bin/kubernetes-validate" --strict -k "$v" "${builtin[@]}" || status=1
done

echo "---- PodMonitor model and cross-reference checks"
"$KV_VENV/bin/python" - "$here" "$tmp/policies" <<'PY' || status=1
import json
import re
import sys
from pathlib import Path

import yaml
from cloudcoil.models.prometheus_operator.v1 import PodMonitor

here, policies_out = Path(sys.argv[1]), Path(sys.argv[2])
problems: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        problems.append(what)


def unknown_keys(given, known, path=""):
    """Keys of `given` that the validated model dropped (pydantic ignores unknown fields)."""
    out = []
    if isinstance(given, dict) and isinstance(known, dict):
        for key, value in given.items():
            if key not in known:
                out.append(f"{path}.{key}".lstrip("."))
            else:
                out += unknown_keys(value, known[key], f"{path}.{key}")
    elif isinstance(given, list) and isinstance(known, list):
        for i, (a, b) in enumerate(zip(given, known)):
            out += unknown_keys(a, b, f"{path}[{i}]")
    return out


docs = {}
for f in sorted(here.glob("*.yaml")):
    for doc in yaml.safe_load_all(f.read_text()):
        if doc:
            docs[(doc["kind"], doc.get("metadata", {}).get("name"))] = (f.name, doc)

kust = docs[("Kustomization", None)][1]
listed = set(kust["resources"])
manifests = {f.name for f in here.glob("*.yaml")} - {"kustomization.yaml"}
check(all((here / r).is_file() for r in listed), "kustomization: every listed resource exists")
check(listed == manifests, f"kustomization: lists every manifest ({sorted(manifests - listed)} missing)")

# PodMonitor against the operator's models.
_, pm = docs[("PodMonitor", "mcp-tools")]
try:
    model = PodMonitor.model_validate(pm)
    check(True, "PodMonitor: valid against monitoring.coreos.com/v1 models")
    extra = unknown_keys(pm, model.model_dump(by_alias=True, exclude_unset=True, mode="json"))
    check(not extra, f"PodMonitor: no unknown fields {extra or ''}")
except Exception as exc:  # a pydantic ValidationError names every field
    check(False, f"PodMonitor: {exc}")

dep = docs[("Deployment", "mcp-tools")][1]
state_store = docs[("Deployment", "mcp-recovery-state")][1]
state_svc = docs[("Service", "mcp-recovery-state")][1]
state_secret = docs[("Secret", "mcp-recovery-state")][1]
svc = docs[("Service", "mcp-tools")][1]
cm = docs[("ConfigMap", "mcp-recovery-policies")][1]
pod = dep["spec"]["template"]
labels = pod["metadata"]["labels"]
containers = {c["name"]: c for c in pod["spec"]["containers"]}
proxy = containers["mcp-recovery-proxy"]
ports = {p["name"]: p["containerPort"] for p in proxy.get("ports", [])}
env = {e["name"]: e.get("value") for e in proxy.get("env", [])}
env_from = {e["name"]: e.get("valueFrom") for e in proxy.get("env", []) if e.get("valueFrom")}


def matches(selector: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


check(matches(dep["spec"]["selector"]["matchLabels"]), "Deployment selector matches the pod labels")
check(matches(svc["spec"]["selector"]), "Service selector matches the pod labels")
check(matches(pm["spec"]["selector"]["matchLabels"]), "PodMonitor selector matches the pod labels")
check([p["targetPort"] for p in svc["spec"]["ports"]] == ["mcp"], "Service exposes only the proxy's MCP port")
check(all(e["port"] in ports for e in pm["spec"]["podMetricsEndpoints"]), "PodMonitor port is a named proxy port")
check(ports.get("admin") == int(pod["metadata"]["annotations"]["prometheus.io/port"]),
      "prometheus.io/port annotation is the admin port")
admin_port = int(env["MCP_RECOVERY_ADMIN"].rpartition(":")[2])
check(admin_port == ports.get("admin"), "MCP_RECOVERY_ADMIN port is the container's admin port")
listen_port = int(re.match(r"http://[^:/]+:(\d+)/", env["MCP_RECOVERY_LISTEN"]).group(1))
check(listen_port == ports.get("mcp"), "MCP_RECOVERY_LISTEN port is the container's mcp port")
for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
    check(proxy.get(probe, {}).get("httpGet", {}).get("port") == "admin", f"proxy {probe} uses the admin port")
check(proxy["readinessProbe"]["httpGet"]["path"] == "/readyz", "readiness probes /readyz")
check(proxy["livenessProbe"]["httpGet"]["path"] == "/healthz", "liveness probes /healthz")
try:
    hosts = json.loads(env["MCP_RECOVERY_ALLOWED_HOSTS"])
    check(isinstance(hosts, list) and all(isinstance(h, str) for h in hosts) and "*" not in hosts,
          f"MCP_RECOVERY_ALLOWED_HOSTS is a JSON list of {len(hosts)} names, no bare '*'")
except ValueError as exc:
    check(False, f"MCP_RECOVERY_ALLOWED_HOSTS is not JSON: {exc}")
check(env["MCP_RECOVERY_UPSTREAM"].startswith("http://127.0.0.1:"), "proxy reaches the upstream over the pod's loopback")

mounts = {m["name"]: m for m in proxy["volumeMounts"]}
vols = {v["name"]: v for v in pod["spec"]["volumes"]}
pm_mount = mounts.get("policies", {})
check(pm_mount.get("mountPath") == env["MCP_RECOVERY_POLICIES"], "policies mounted at MCP_RECOVERY_POLICIES")
check("subPath" not in pm_mount and "subPathExpr" not in pm_mount, "policies mounted whole (no subPath: hot reload)")
check(vols["policies"]["configMap"]["name"] == cm["metadata"]["name"], "policies volume names the ConfigMap")

# More than one replica only with a shared store (each would keep its own ledger otherwise).
state_ref = (env_from.get("MCP_RECOVERY_STATE") or {}).get("secretKeyRef", {})
check(dep["spec"]["replicas"] == 1 or state_ref.get("name") == state_secret["metadata"]["name"],
      f"{dep['spec']['replicas']} replicas share a store: MCP_RECOVERY_STATE from the Secret")
check(state_ref.get("key") in state_secret.get("stringData", {}), "the Secret holds the key MCP_RECOVERY_STATE reads")
url = state_secret["stringData"][state_ref["key"]]
check(re.match(r"(redis|rediss|valkey|valkeys)://", url) is not None, "the store URL has a scheme the proxy takes")
store_port = next(p for p in state_svc["spec"]["ports"] if p["name"] == "redis")
check(url.startswith(f"redis://{state_svc['metadata']['name']}:{store_port['port']}/"),
      "the shipped URL names the store's Service and port")
store_labels = state_store["spec"]["template"]["metadata"]["labels"]
check(all(store_labels.get(k) == v for k, v in state_svc["spec"]["selector"].items()),
      "the store's Service selects the store's pod")
check(state_store["spec"]["template"]["spec"]["securityContext"].get("runAsNonRoot") is True, "store runs as non-root")

psc = pod["spec"].get("securityContext", {})
check(psc.get("runAsNonRoot") is True and psc.get("runAsUser", 0) != 0, "pod runs as non-root")
for name, c in containers.items():
    sc = c.get("securityContext", {})
    check(sc.get("readOnlyRootFilesystem") is True, f"{name}: read-only root filesystem")
    check(sc.get("allowPrivilegeEscalation") is False, f"{name}: no privilege escalation")
    check(sc.get("capabilities", {}).get("drop") == ["ALL"], f"{name}: drops ALL capabilities")
    res = c.get("resources", {})
    check(all(k in res.get(t, {}) for t in ("requests", "limits") for k in ("cpu", "memory")),
          f"{name}: cpu and memory requests and limits")

policies_out.mkdir(parents=True)
for name, text in cm["data"].items():
    (policies_out / name).write_text(text)
print(f"\n{len(problems)} problem(s)")
sys.exit(1 if problems else 0)
PY

echo "---- policy files of the ConfigMap"
if [[ -x $repo/.venv/bin/python ]] && (cd "$repo" && .venv/bin/python -c "import proxy.cli") 2>/dev/null; then
  (cd "$repo" && .venv/bin/python -m proxy policies check "$tmp/policies") || status=1
elif command -v mcp-recovery-proxy >/dev/null; then
  mcp-recovery-proxy policies check "$tmp/policies" || status=1
else
  echo "SKIP policies check: neither $repo/.venv nor mcp-recovery-proxy on PATH"
fi

if [[ $status == 0 ]]; then echo "VALID deploy/kubernetes"; else echo "INVALID deploy/kubernetes"; fi
exit $status
