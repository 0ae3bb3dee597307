#!/usr/bin/env bash
# The C++ tests on aarch64 under QEMU user emulation: cross-builds the tests into build-arm/ and
# runs them on a NEON-only CPU and on SVE2 CPUs with 256- and 128-bit vectors, so that every
# Highway Arm target (neon, sve, sve2, sve_256, sve2_128) is compared with the reference kernels.
# Exits non-zero if a test fails or a CPU does not offer exactly the targets it should.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

step "aarch64 cross toolchain, arm64 libraries and QEMU"
ensure_dpkg_architecture arm64
ensure_apt_packages cmake ninja-build pkg-config nlohmann-json3-dev g++-aarch64-linux-gnu libhwy-dev:arm64 \
                    libgtest-dev:arm64 qemu-user-static

step "aarch64 cross build (Release, -Werror, build-arm/)"
SECONDS=0
cmake -S . -B build-arm -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
      -DMICROSCALE_WERROR=ON -DMICROSCALE_BUILD_PYTHON=OFF -DMICROSCALE_BUILD_BENCH=OFF -DMICROSCALE_BUILD_CLI=OFF \
      -DMICROSCALE_CUDA=OFF
# Only the two suites that exercise the kernels: the checkpoint I/O tests hold no SIMD code and
# would add minutes of compiling and emulation.
cmake --build build-arm -j "$(jobs)" --target microscale_tests microscale_cpu_tests
echo "cross build: ${SECONDS} s"

# The emulator of cmake/aarch64-linux-gnu.cmake (see there why LD_LIBRARY_PATH); QEMU_CPU picks
# the CPU. The test programs are run directly: one QEMU process per test (ctest) would spend
# minutes starting up.
QEMU=(qemu-aarch64-static -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib)
LOGS=build-arm/logs
mkdir -p "$LOGS"
failed=()

# run_cpu NAME QEMU_CPU "EXPECTED TARGETS" [CPU_TESTS_FILTER]: both suites, each split into
# $(jobs) gtest shards, all run side by side (a QEMU process mostly keeps one core busy, and four
# processes level out shards of unequal length); then checks the targets the CPU offered. A shard
# still running after 20 minutes (several times the expected) is taken as hung and fails.
run_cpu() {
  local name=$1 cpu=$2 expected=$3 cpu_filter=${4:-*} n suite filter seen i logs=() pids=()
  step "aarch64 tests under QEMU -cpu $cpu ($name): microscale_tests, microscale_cpu_tests${4:+ ($cpu_filter)}${MICROSCALE_TEST_TARGETS:+, testing $MICROSCALE_TEST_TARGETS}"
  SECONDS=0
  n=$(jobs)
  for suite in cpp/microscale_tests cpu/microscale_cpu_tests; do
    # The death tests that re-execute the binary (to read the environment afresh) cannot run under
    # qemu-user, which has no binfmt hook for the re-exec; they run in the x86 ctest.
    filter='-RuntimeDeathTest.*'
    [ "$suite" = cpp/microscale_tests ] || filter=$cpu_filter
    for ((i = 0; i < n; i++)); do
      logs+=("$LOGS/$name.${suite#*/}.$i.log")
      QEMU_CPU=$cpu GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i timeout 1200 \
        "${QEMU[@]}" "build-arm/tests/$suite" --gtest_brief=1 --gtest_filter="$filter" >"${logs[-1]}" 2>&1 &
      pids+=($!)
    done
  done
  for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
      cat "${logs[$i]}"
      failed+=("$name: ${logs[$i]}")
    fi
  done
  grep -H -E '^\[  (PASSED|FAILED)  \] [0-9]+ tests?\.' "${logs[@]}" || true
  # Runtime.BackendConfigsCoverReferenceAndEveryTarget prints the targets the CPU offers and
  # those under test.
  grep -h -E '^(cpu targets offered|backends under test):' "${logs[@]}" || true
  seen=$(grep -h '^cpu targets offered:' "${logs[@]}" | cut -d: -f2 | tr ' ' '\n' | sort -u | xargs || true)
  expected=$(tr ' ' '\n' <<<"$expected" | sort | xargs)
  echo "targets seen: ${seen:-none} (expected: $expected); ${SECONDS} s"
  [ "$seen" = "$expected" ] || failed+=("$name: targets '${seen:-none}', expected '$expected'")
}

# QEMU 7.2's "max" CPU has SVE2; sveN=on caps the vector length at N bits, which Highway's
# fixed-length targets need (sve_256 at 256 bits, sve2_128 at 128 bits). To keep the step's time
# in bounds the 128-bit run skips the two exhaustive 16-bit-pattern tests: they sweep values over
# one shape, and sve2_128 shares its vector length with neon and its instructions with sve2,
# which both run them.
# The SVE CPUs offer neon too, which the first run has covered: they test the reference (their
# oracle) and the SVE targets only (MICROSCALE_TEST_TARGETS, read by the test suites). The
# scalable sve and sve2 targets run at both vector lengths.
run_cpu neon max,sve=off "neon"
MICROSCALE_TEST_TARGETS="reference sve_256 sve2 sve" run_cpu sve256 max,sve256=on "sve_256 sve2 sve neon"
MICROSCALE_TEST_TARGETS="reference sve2_128 sve2 sve" \
  run_cpu sve128 max,sve128=on "sve2_128 sve2 sve neon" '-CpuQuantize.EveryBf16Pattern:CpuQuantize.EveryF16Pattern'

if [ ${#failed[@]} -gt 0 ]; then
  step "aarch64 tests FAILED"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
step "aarch64 tests passed"
