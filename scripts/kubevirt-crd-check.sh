#!/usr/bin/env bash
# Checks autonodes and its KubeVirt simulator against KubeVirt's own CRDs. A check run by
# hand, not a test: the tests use the project's own KubeVirt CRDs , and KubeVirt's
# generated CRDs are not part of this repository.
#
#   scripts/kubevirt-crd-check.sh DIR
#
# DIR holds `virtualmachines.yaml`, `virtualmachineinstances.yaml` and `datavolumes.yaml` as
# KubeVirt and CDI generate them (for a v1.20 API server: without CEL rules). The script
#  1. starts the playground (`autonodes-dev dev`) and replaces its KubeVirt CRDs with DIR's;
#  2. sends every VirtualMachine the example providers' node types render to the host API
#     server as a server-side dry run and prints any field the API server pruned or changed
#     ("unchanged" when it stored exactly what autonodes wrote), and likewise the DataVolume
#     each of its DataVolume templates becomes;
#  3. claims a node from the playground's provider and waits until the claim is Available,
#     the simulator having booted its VM on KubeVirt's CRDs (the VMI's status written with
#     the VMI, which has no status subresource there);
#  4. deletes the claim and waits until its VM is gone.
# Everything it starts is stopped at the end.
set -euo pipefail
DIR=${1:?usage: scripts/kubevirt-crd-check.sh DIR-WITH-KUBEVIRT-CRDS}
for f in virtualmachines virtualmachineinstances datavolumes; do
  [ -f "$DIR/$f.yaml" ] || { echo "kubevirt-crd-check: $DIR/$f.yaml is missing" >&2; exit 1; }
done
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
log() { echo "kubevirt-crd-check: $*" >&2; }

WORK=$(mktemp -d /tmp/autonodes-crd-check.XXXXXX)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cargo build -q -p autonodes -p autonodes-dev
./target/debug/autonodes-dev dev --dir "$WORK/dev" --metrics-addr "127.0.0.1:$PORT" \
  --boot-time 1s > "$WORK/dev.log" 2>&1 &
DEV=$!
cleanup() {
  kill -INT "$DEV" 2> /dev/null || true
  wait "$DEV" 2> /dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq 1 600); do
  grep -q "autonodes playground is up" "$WORK/dev.log" && break
  kill -0 "$DEV" 2> /dev/null || { cat "$WORK/dev.log" >&2; exit 1; }
  sleep 1
done
grep -q "autonodes playground is up" "$WORK/dev.log" || { log "the playground did not come up"; exit 1; }
kc() { awk -v k="$1:" '$1 == k {print $2; exit}' "$WORK/dev.log"; }
KUBECTL=$(kc kubectl)
# A discovery cache of our own: ~/.kube/cache is keyed by host and port, and one left by an
# earlier server on the same port hides the playground's short names (nclaim).
KUBECTL_CACHE="$WORK/kubectl-cache"
kubectl_() { "$KUBECTL" --cache-dir "$KUBECTL_CACHE" "$@"; }
MGMT=$(kc management)
HOST=$(kc host)

log "replacing the playground's KubeVirt CRDs with those in $DIR"
for f in virtualmachines virtualmachineinstances datavolumes; do
  kubectl_ --kubeconfig "$HOST" apply --server-side --force-conflicts \
    --field-manager kubevirt-crd-check -f "$DIR/$f.yaml" > /dev/null
done
kubectl_ --kubeconfig "$HOST" wait --for condition=Established --timeout 60s \
  crd/virtualmachines.kubevirt.io crd/virtualmachineinstances.kubevirt.io \
  crd/datavolumes.cdi.kubevirt.io > /dev/null
kubectl_ --kubeconfig "$HOST" get crd virtualmachineinstances.kubevirt.io \
  -o jsonpath='{range .spec.versions[*]}{.name}: status subresource {.subresources.status}{"\n"}{end}' \
  | sed 's/subresource $/subresource none/; s/^/  VMI CRD /'

log "rendered VirtualMachines, stored by a server-side dry run on KubeVirt's CRDs:"
printf 'apiVersion: autonodes.io/v1alpha1\nkind: NodeClaim\nmetadata:\n  name: check-1\n  namespace: tenant\nspec:\n  vClusterRef:\n    name: tenant\n' > "$WORK/claim.yaml"
for provider in examples/nodeprovider-*.yaml; do
  types=$(python3 - "$provider" << 'EOF'
import sys, re
text = open(sys.argv[1]).read()
print(" ".join(re.findall(r'^      - name: "?([^"\s]+)"?\s*$', text, re.M)))
EOF
)
  for t in $types; do
    ./target/debug/autonodes render --provider "$provider" --claim "$WORK/claim.yaml" \
      --node-type "$t" -o json > "$WORK/render.json"
    python3 - "$WORK/render.json" > "$WORK/vm.json" << 'EOF'
import json, sys
items = json.load(open(sys.argv[1]))["items"]
vm = next(i for i in items if i["kind"] == "VirtualMachine")
vm["metadata"]["namespace"] = "default"
print(json.dumps(vm))
EOF
    kubectl_ --kubeconfig "$HOST" create --dry-run=server -o json -f "$WORK/vm.json" > "$WORK/stored.json"
    python3 - "$WORK/vm.json" "$WORK/stored.json" "$(basename "$provider") $t" << 'EOF'
import json, sys
sent, stored, what = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
diffs = []
def walk(a, b, path):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a:
            if k not in b:
                diffs.append(f"pruned {path}/{k}")
            else:
                walk(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            walk(x, y, f"{path}/{i}")
    elif a != b:
        diffs.append(f"changed {path}: {json.dumps(a)} -> {json.dumps(b)}")
walk(sent["spec"], stored["spec"], "spec")
walk(sent["metadata"].get("labels", {}), stored["metadata"].get("labels", {}), "metadata/labels")
print(f"  {what}: " + ("unchanged" if not diffs else "; ".join(diffs)))
EOF
    # Each DataVolume template, as the DataVolume KubeVirt makes from it, on CDI's CRD.
    python3 - "$WORK/vm.json" "$WORK/dv" << 'EOF'
import json, sys
vm = json.load(open(sys.argv[1]))
for i, t in enumerate(vm["spec"].get("dataVolumeTemplates", [])):
    dv = {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
          "metadata": {"name": t["metadata"]["name"], "namespace": "default"}, "spec": t["spec"]}
    json.dump(dv, open(f"{sys.argv[2]}-{i}.json", "w"))
EOF
    for dv in "$WORK"/dv-*.json; do
      [ -e "$dv" ] || continue
      kubectl_ --kubeconfig "$HOST" create --dry-run=server -o json -f "$dv" > "$WORK/stored.json"
      python3 - "$dv" "$WORK/stored.json" << 'EOF'
import json, sys
sent, stored = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print(f"    DataVolume {sent['metadata']['name']}: " + ("unchanged" if sent["spec"] == stored["spec"] else f"CHANGED: {json.dumps(stored['spec'])}"))
EOF
      rm -f "$dv"
    done
  done
done

# The control: a field KubeVirt does not know must be reported as pruned, or the comparison
# above proves nothing.
python3 - "$WORK/vm.json" > "$WORK/control.json" << 'EOF'
import json, sys
vm = json.load(open(sys.argv[1]))
vm["spec"]["template"]["spec"]["volumes"][0]["userDataSecretRef"] = {"name": "misspelt"}
print(json.dumps(vm))
EOF
kubectl_ --kubeconfig "$HOST" create --dry-run=server --validate=false -o json -f "$WORK/control.json" > "$WORK/stored.json"
python3 - "$WORK/control.json" "$WORK/stored.json" << 'EOF'
import json, sys
sent, stored = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
pruned = "userDataSecretRef" not in stored["spec"]["template"]["spec"]["volumes"][0]
print("  control, a misspelt volume field: " + ("pruned, as it must be" if pruned else "KEPT: the comparison cannot be trusted"))
sys.exit(0 if pruned else 1)
EOF

log "claiming a node from the playground's provider"
kubectl_ --kubeconfig "$MGMT" apply -f examples/nodeclaim.yaml > /dev/null
claim=$(python3 -c 'import re,sys; t=open("examples/nodeclaim.yaml").read(); print(re.search(r"^  name: (\S+)", t, re.M).group(1), re.search(r"^  namespace: (\S+)", t, re.M).group(1))')
read -r name ns <<< "$claim"
started=$(date +%s)
until [ "$(kubectl_ --kubeconfig "$MGMT" get nclaim -n "$ns" "$name" -o jsonpath='{.status.phase}')" = Available ]; do
  [ $(($(date +%s) - started)) -lt 180 ] || {
    kubectl_ --kubeconfig "$MGMT" get nclaim -n "$ns" "$name" -o yaml >&2
    log "the claim did not become Available"; exit 1; }
  sleep 1
done
kubectl_ --kubeconfig "$MGMT" get nclaim -n "$ns" "$name" -o wide
kubectl_ --kubeconfig "$HOST" get vm,vmi -A
log "deleting the claim"
kubectl_ --kubeconfig "$MGMT" delete nclaim -n "$ns" "$name" --wait=true --timeout=180s > /dev/null
left=$(kubectl_ --kubeconfig "$HOST" get vm,vmi,dv -A --no-headers 2> /dev/null | wc -l)
echo "  after deletion: $left VMs, VMIs and DataVolumes left"
[ "$left" = 0 ]
