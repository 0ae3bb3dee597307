#!/usr/bin/env bash
# Builds the fuzz targets with clang (libFuzzer + AddressSanitizer + UBSan) outside the main CMake
# build and runs each for SECONDS (default 60) over its seed corpus:
#   safetensors  the safetensors parser alone (fuzz_safetensors.cpp, seeds in corpus/)
#   checkpoint   whole model directories through inspect / load / dequantize / convert /
#                quantize (fuzz_checkpoint.cpp, seeds in corpus_checkpoint/)
#   gguf         GGUF files through inspect / dequantize / convert, and tokenizer files through the
#                GGUF export (fuzz_gguf.cpp, seeds in corpus_gguf/ from make_gguf_corpus.py)
#   tests/fuzz/run.sh [SECONDS] [extra libFuzzer flags...]
# FUZZ_TARGETS picks targets (default "safetensors checkpoint gguf"). New inputs go to
# $FUZZ_DIR/corpus-<target> (default build-fuzz/), never into the committed seeds; a finding
# leaves its input as $FUZZ_DIR/crash-* and makes the script exit non-zero.
set -euo pipefail
secs=${1:-60}
shift || true
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${FUZZ_DIR:-$root/build-fuzz}
cxx=${CLANGXX:-clang++}
targets=${FUZZ_TARGETS:-safetensors checkpoint gguf}

probe() {  # can $cxx link a libFuzzer target that includes nlohmann-json?
  command -v "$cxx" >/dev/null 2>&1 || return 1
  printf '#include <nlohmann/json.hpp>\nextern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' |
    "$cxx" -std=c++20 -x c++ - -fsanitize=fuzzer,address -o /dev/null >/dev/null 2>&1
}

if ! probe; then
  echo "run.sh: installing clang, the libFuzzer runtime and nlohmann-json" >&2
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -q
  # Debian 12 ships the runtime as libclang-rt-dev (clang 14: libclang-rt-14-dev).
  $sudo apt-get install -y -q clang nlohmann-json3-dev libclang-rt-dev ||
    $sudo apt-get install -y -q clang nlohmann-json3-dev libclang-rt-14-dev
  probe || { echo "run.sh: $cxx still cannot build a libFuzzer target" >&2; exit 1; }
fi

# libstdc++'s assertions catch what the sanitizers let pass: an empty std::optional dereferenced,
# an out-of-range operator[] inside a vector's capacity.
flags=(-std=c++20 -O1 -gline-tables-only -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -D_GLIBCXX_ASSERTIONS -I"$root/include" -I"$root/src")

build_safetensors() {
  "$cxx" "${flags[@]}" "$root/tests/fuzz/fuzz_safetensors.cpp" \
    "$root/src/io/common.cpp" "$root/src/io/reader.cpp" "$root/src/io/file_mapping.cpp" \
    "$root/src/core/dtype.cpp" "$root/src/core/tensor.cpp" \
    -o "$work/fuzz_safetensors"
}

build_library() {
  # The whole library (CUDA aside), from the project's own CMake lists, instrumented for coverage
  # and sanitizers; incremental across runs. Highway builds only its static target here: the
  # kernels' other targets are the CPU tests' business and would take minutes to instrument. On
  # x86 that target is SSE4 rather than the default emulated 128-bit one, which clang takes ten
  # minutes to instrument in src/cpu/quantize.cpp alone (15 s as SSE4). -O1 with line tables only
  # (enough for the reports' file:line) compiles about a tenth faster than -O2 -g.
  local lib="$work/lib" gen=() launcher=() static="-DHWY_COMPILE_ONLY_STATIC=1 -D_GLIBCXX_ASSERTIONS"
  [ "$(uname -m)" != x86_64 ] || static+=" -msse4.2 -mpclmul -maes"
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S "$root" -B "$lib" "${gen[@]}" "${launcher[@]}" -DCMAKE_CXX_COMPILER="$(command -v "$cxx")" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
    -DCMAKE_CXX_FLAGS="$static" \
    -DMICROSCALE_SANITIZE=fuzzer-no-link,address,undefined -DMICROSCALE_CUDA=OFF \
    -DMICROSCALE_BUILD_TESTS=OFF -DMICROSCALE_BUILD_CLI=OFF -DMICROSCALE_BUILD_BENCH=OFF \
    -DMICROSCALE_BUILD_PYTHON=OFF >/dev/null
  cmake --build "$lib" --target microscale -j "$(nproc)"
}

link_on_library() {  # NAME: tests/fuzz/fuzz_NAME.cpp against the instrumented library
  build_library
  # shellcheck disable=SC2046  # pkg-config prints several words
  "$cxx" "${flags[@]}" "$root/tests/fuzz/fuzz_$1.cpp" "$work/lib/libmicroscale.a" \
    $(pkg-config --libs libhwy) -pthread -o "$work/fuzz_$1"
}
build_checkpoint() { link_on_library checkpoint; }
build_gguf() { link_on_library gguf; }

mkdir -p "$work"
for t in $targets; do
  max_len=4096
  case $t in
    safetensors) seeds="$root/tests/fuzz/corpus"; extra=(-dict="$root/tests/fuzz/safetensors.dict") ;;
    checkpoint) seeds="$root/tests/fuzz/corpus_checkpoint"; extra=() ;;
    # Its seeds hold whole GGUF files and tokenizer.json texts of several KB.
    gguf) seeds="$root/tests/fuzz/corpus_gguf"; extra=(-dict="$root/tests/fuzz/gguf.dict"); max_len=16384 ;;
    *) echo "run.sh: unknown fuzz target '$t' (safetensors, checkpoint, gguf)" >&2; exit 2 ;;
  esac
  echo "=== fuzz_$t: build" >&2
  "build_$t"
  bin="$work/fuzz_$t"
  mkdir -p "$work/corpus-$t"
  # Every seed must run clean first (valid seeds exercise the invariants).
  "$bin" -runs=0 "$seeds"
  echo "=== fuzz_$t: ${secs} s" >&2
  "$bin" "$work/corpus-$t" "$seeds" "${extra[@]}" \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" \
    -artifact_prefix="$work/" -print_final_stats=1 "$@"
done
