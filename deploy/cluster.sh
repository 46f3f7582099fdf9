#!/usr/bin/env bash
# Starts a local multi-process cluster from a cluster config: every prefill and decode node
# it lists, then the gateway; stops them all on Ctrl-C (or when one of them exits).
#
#   deploy/cluster.sh [deploy/cluster.yaml]      # after ./deploy/setup.sh && cmake --build build
#
# Logs go to $DELTASERVE_LOG_DIR (default: build/cluster-logs).
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:-deploy/cluster.yaml}
BIN=${DELTASERVE_BIN:-build/bin/deltaserve}
LOGS=${DELTASERVE_LOG_DIR:-build/cluster-logs}
mkdir -p "$LOGS"
[ -x "$BIN" ] || { echo "cluster: $BIN not built (run ./deploy/setup.sh && cmake --build build)" >&2; exit 1; }

# The node names of a role, from the config (a "- {name: X, ..." or "- name: X" line under it).
names() {
  python3 - "$CONFIG" "$1" <<'PY'
import re, sys
role, out, section = sys.argv[2], [], None
for line in open(sys.argv[1]):
    top = re.match(r"^(\w+):", line)
    if top:
        section = top.group(1)
    m = re.search(r"name:\s*\"?([\w.-]+)", line)
    if section == role and m:
        out.append(m.group(1))
print(" ".join(out))
PY
}

pids=()
stop() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap stop EXIT INT TERM
for role in decode prefill; do
  for name in $(names "$role"); do
    "$BIN" "$role" --config "$CONFIG" --name "$name" 2>"$LOGS/$name.log" &
    pids+=($!)
    echo "cluster: $role node $name (pid $!, log $LOGS/$name.log)" >&2
  done
done
"$BIN" gateway --config "$CONFIG" 2>&1 | tee "$LOGS/gateway.log" &
pids+=($!)
wait -n "${pids[@]}"
echo "cluster: a process exited; stopping the others" >&2
