#!/usr/bin/env bash
# Sets up (packages, default model, build), makes the default model's DeltaKV profile
# (deploy/profile.sh: about 18 minutes once per machine), then runs every test.
# Tests that need ../shared (stories260K) skip with a message where it is absent;
# point DELTASERVE_SHARED_DIR elsewhere to use another copy.
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/setup.sh
./deploy/profile.sh
ctest --test-dir "${DELTASERVE_BUILD_DIR:-build}" --output-on-failure -j2 "$@"
