#!/usr/bin/env bash
# Builds the safetensors fuzz target with clang (libFuzzer + AddressSanitizer + UBSan) outside the
# CMake build and runs it for SECONDS (default 60) over the seed corpus.
#   tests/fuzz/run.sh [SECONDS] [extra libFuzzer flags...]
# New inputs go to $FUZZ_DIR/corpus (default build-fuzz/), never into the committed seeds; a
# finding leaves its input as $FUZZ_DIR/crash-* and makes the script exit non-zero.
set -euo pipefail
secs=${1:-60}
shift || true
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${FUZZ_DIR:-$root/build-fuzz}
cxx=${CLANGXX:-clang++}

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

mkdir -p "$work/corpus"
bin="$work/fuzz_safetensors"
"$cxx" -std=c++20 -O1 -g -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$root/include" -I"$root/src" \
  "$root/tests/fuzz/fuzz_safetensors.cpp" \
  "$root/src/io/common.cpp" "$root/src/io/reader.cpp" \
  "$root/src/core/dtype.cpp" "$root/src/core/tensor.cpp" \
  -o "$bin"

# Every seed must run clean first (valid seeds exercise the round trip invariants).
"$bin" -runs=0 "$root/tests/fuzz/corpus"

"$bin" "$work/corpus" "$root/tests/fuzz/corpus" \
  -dict="$root/tests/fuzz/safetensors.dict" \
  -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
  -artifact_prefix="$work/" -print_final_stats=1 "$@"
