#!/usr/bin/env bash
# Engine lab, llama.cpp half: installs real llama.cpp servers from PyPI only, on a CPU-only host.
#
#   tests/engines/llamacpp_lab.sh            # venv + llama-cpp-python[server] + gguf + C++ llama-server
#
# Idempotent: every step is skipped when its result is already there. Everything lands under
# ${DIAGNOSE_ENGINES:-<repo>/.engines} (git-ignored):
#   .engines/llamacpp/               the venv (python -m llama_cpp.server, gguf)
#   .engines/src/llama_cpp_python-0.3.36/vendor/llama.cpp   the sdist's vendored llama.cpp
#   .engines/llama-server-build/     cmake build of the llama-server target
#   .engines/models/                 the random-weight GGUFs (tests/engines/make_gguf.py: small, big, an "L4"-named small)
#   .engines/bin/llama-server        the C++ server binary (linked against the wheel's libllama/libggml
#                                    .so; LLAMA_SERVER_FULL_BUILD=1 builds it all from source instead)
# Each step prints its wall time. Nothing is downloaded except from PyPI (and apt, only if cmake
# or g++ is missing).
set -euo pipefail

VERSION=0.3.36
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ENGINES="$(realpath -m "${DIAGNOSE_ENGINES:-$REPO/.engines}")"  # as install_vllm.sh, tests/engines/lab.py, the Makefile
VENV="$ENGINES/llamacpp"
READY="$ENGINES/llamacpp.ready"  # written last, once every step has succeeded (tests/engines/lab.py reads it)
SRC="$ENGINES/src"
BUILD="$ENGINES/llama-server-build"
BIN="$ENGINES/bin"
MODELS="$ENGINES/models"
PY="${PYTHON:-python3}"
JOBS="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
export CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"

step() {  # step NAME CMD...: run, print wall time
    local name="$1"; shift
    local t0; t0=$(date +%s)
    echo "== $name"
    "$@"
    echo "== $name: $(( $(date +%s) - t0 )) s"
}

need_tools() {
    if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then
        local sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
        $sudo apt-get update && $sudo apt-get install -y cmake g++ make
    fi
    cmake --version | head -1; g++ --version | head -1
}

make_venv() {
    if [ -x "$VENV/bin/python" ]; then echo "venv exists: $VENV"; return; fi
    mkdir -p "$ENGINES"
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
}

install_python_server() {
    if "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('llama_cpp_python') != '$VERSION')" 2>/dev/null \
       && "$VENV/bin/python" -c "import llama_cpp.server, gguf, uvicorn" 2>/dev/null; then
        echo "llama-cpp-python $VERSION and gguf already installed"; return
    fi
    # PyPI has only the sdist: this compiles llama.cpp (~4.5 min on 2 cores).
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}" \
        "$VENV/bin/python" -m pip install "llama-cpp-python[server]==$VERSION" gguf
}

fetch_sdist() {
    local dir="$SRC/llama_cpp_python-$VERSION"
    if [ -f "$dir/vendor/llama.cpp/CMakeLists.txt" ]; then echo "sources exist: $dir"; return; fi
    mkdir -p "$SRC"
    # the sdist only: its build requirements (to read its metadata) may be wheels
    "$VENV/bin/python" -m pip download -q --no-binary llama-cpp-python --no-deps -d "$SRC" "llama-cpp-python==$VERSION"
    tar -xzf "$SRC/llama_cpp_python-$VERSION.tar.gz" -C "$SRC"
    ls "$dir/vendor/llama.cpp" >/dev/null
}

build_llama_server() {
    if [ -x "$BIN/llama-server" ]; then echo "exists: $BIN/llama-server"; return; fi
    local llama="$SRC/llama_cpp_python-$VERSION/vendor/llama.cpp"
    cmake -S "$llama" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=ON >"$ENGINES/llama-server-cmake.log"
    mkdir -p "$BIN"
    if [ "${LLAMA_SERVER_FULL_BUILD:-0}" = 1 ]; then
        # everything from source: ggml, llama, mtmd, common, server (~2x the pip build's time)
        cmake --build "$BUILD" --target llama-server -j "$JOBS" >"$ENGINES/llama-server-build.log"
        cp "$BUILD/bin/llama-server" "$BIN/llama-server.tmp" && mv "$BIN/llama-server.tmp" "$BIN/llama-server"
        return
    fi
    # Fast path: the wheel just built libggml*, libllama and libmtmd from these very sources (same
    # version, same -DGGML_NATIVE=OFF), so compile only what llama-server adds on top (common, the
    # server, cpp-httplib, the UI stub) with each target's own Makefile rule — no dependent targets —
    # and link against the wheel's shared libraries.
    local lib
    lib="$("$VENV/bin/python" -c 'import llama_cpp, os; print(os.path.join(os.path.dirname(llama_cpp.__file__), "lib"))')"
    (
        cd "$BUILD"
        for t in tools/ui/CMakeFiles/llama-ui-assets.dir tools/ui/CMakeFiles/llama-ui.dir \
                 vendor/hash/CMakeFiles/vendor-hash.dir vendor/cpp-httplib/CMakeFiles/cpp-httplib.dir \
                 common/CMakeFiles/llama-common-base.dir common/CMakeFiles/llama-common.dir \
                 tools/server/CMakeFiles/server-context.dir tools/server/CMakeFiles/llama-server-impl.dir; do
            make -j "$JOBS" -f "$t/build.make" "$t/build"
        done
        make -f tools/server/CMakeFiles/llama-server.dir/build.make \
            tools/server/CMakeFiles/llama-server.dir/main.cpp.o
        c++ -O3 tools/server/CMakeFiles/llama-server.dir/main.cpp.o -o "$BIN/llama-server.tmp" \
            tools/server/libllama-server-impl.a tools/server/libserver-context.a common/libllama-common.a \
            common/libllama-common-base.a vendor/hash/libvendor-hash.a tools/ui/libllama-ui.a \
            vendor/cpp-httplib/libcpp-httplib.a \
            -L"$lib" -lmtmd -lllama -lggml -lggml-cpu -lggml-base -Wl,-rpath,"$lib" \
            -lssl -lcrypto -lgomp -lpthread -ldl -lm
        mv "$BIN/llama-server.tmp" "$BIN/llama-server"  # whole or not there: a killed link leaves no binary
    ) >"$ENGINES/llama-server-build.log" 2>&1 || { tail -30 "$ENGINES/llama-server-build.log"; return 1; }
}

gguf() {  # gguf NAME [--big]: write one model, whole or not at all (a killed write leaves only NAME.tmp)
    local out="$MODELS/$1"; shift
    [ -f "$out" ] && return
    "$VENV/bin/python" "$REPO/tests/engines/make_gguf.py" "$out.tmp" "$@" && mv "$out.tmp" "$out"
}

make_models() {  # the lab's random-weight GGUFs (tests/engines/make_gguf.py)
    mkdir -p "$MODELS"
    gguf lab-llama-small.gguf
    gguf lab-llama-big.gguf --big
    # the small model under a name holding "L4" (as "…-L4-…" quantisations do), never an NVIDIA L4 GPU
    gguf lab-llama-L4-small-f32.gguf
    ls -l "$MODELS"
}

T0=$(date +%s)
rm -f "$READY"
step "tools (cmake, g++)" need_tools
step "venv $VENV" make_venv
step "pip install llama-cpp-python[server]==$VERSION gguf (compiles)" install_python_server
step "pip download sdist $VERSION" fetch_sdist
step "cmake build llama-server" build_llama_server
step "models $MODELS" make_models
"$VENV/bin/python" -c "import importlib.metadata as m; print('llama-cpp-python', m.version('llama_cpp_python'), '| gguf', m.version('gguf'))"
"$BIN/llama-server" --version 2>&1 | tail -2 || true
touch "$READY"
echo "== total: $(( $(date +%s) - T0 )) s"
