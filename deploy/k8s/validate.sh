#!/usr/bin/env bash
# Renders deploy/k8s with kubectl kustomize and validates every object against Kubernetes'
# schemas, offline and strict (kubernetes-validate from .venv-tools, deploy/setup.sh installs
# it): an unknown field or a wrong type fails. (The cluster config the ConfigMap carries is
# read by tests/api/cluster_config_test.cpp.)
set -euo pipefail
cd "$(dirname "$0")/../.."
VALIDATE=${KUBERNETES_VALIDATE:-.venv-tools/bin/kubernetes-validate}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
kubectl kustomize deploy/k8s > "$out/all.yaml"
# One object per file: kubernetes-validate reads documents, and names each failure's file.
"${PYTHON:-.venv-tools/bin/python}" - "$out" <<'PY'
import sys, yaml
out = sys.argv[1]
docs = [d for d in yaml.safe_load_all(open(f"{out}/all.yaml")) if d]
for i, d in enumerate(docs):
    with open(f"{out}/{i:02d}-{d['kind']}-{d['metadata']['name']}.yaml", "w") as f:
        yaml.safe_dump(d, f)
print(f"[k8s] {len(docs)} objects: " + ", ".join(sorted({d['kind'] for d in docs})), file=sys.stderr)
PY
"$VALIDATE" --strict --quiet "$out"/[0-9]*.yaml
echo "[k8s] every object validates (strict)" >&2
