#!/usr/bin/env bash
# The GPU check of the CUDA backend (docs/cuda.md): the tests of tests/cuda, compute-sanitizer,
# the benchmark against the same-run copy roof and cuBLAS, and the torch/torchao peers, in one run
# that writes logs and a JSON summary under $OUT.
#
#   scripts/gpu-check.sh build [DIR]   configure and build the CUDA tests and benchmark into DIR
#                                      (default build-gpu), then gather what they need to run into
#                                      DIR/carry (the binaries and the non-CUDA shared libraries)
#   scripts/gpu-check.sh run [DIR]     run everything from DIR/carry; results under $OUT
#                                      (default ./gpu-check-out)
#   scripts/gpu-check.sh [DIR]         build unless DIR/carry is there, then run
#
# Environment: MEMCHECK_FILTER, RACECHECK_FILTER, INITCHECK_FILTER, SYNCCHECK_FILTER narrow the
# sanitizers' gtest filters (defaults: everything each tool is meant for, about 3 minutes on an
# H200, racecheck the longest); NCU_KERNELS ("NAME:SKIP ...", NAME a regex) adds Nsight Compute
# reports of single kernels of one benchmark pass.
#
# The build needs the project's dependencies (scripts/common.sh APT_PACKAGES) and nvcc; a GPU
# machine without them (the lent device image has CUDA, torch and CMake but not Highway or
# GoogleTest) runs DIR/carry built elsewhere with the same nvcc. Every step of `run` has its own
# time limit, so a hang costs that step only and the summary is still written. Python wheels in
# .whl/ (torchao) are installed for the peers when present.
set -uo pipefail
cd "$(dirname "$0")/.."

mode=auto
case "${1:-}" in
  build | run) mode=$1; shift ;;
esac
DIR=${1:-build-gpu}
CARRY=$DIR/carry
JOBS=$(nproc)

build() {
  set -e
  cmake -S . -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMICROSCALE_WERROR=ON -DMICROSCALE_CUDA=ON \
    -DMICROSCALE_BUILD_TESTS=ON -DMICROSCALE_BUILD_CLI=OFF -DMICROSCALE_BUILD_BENCH=OFF -DMICROSCALE_INSTALL=OFF
  cmake --build "$DIR" -j "$JOBS" --target microscale_cuda_tests microscale_cuda_bench
  rm -rf "$CARRY"
  mkdir -p "$CARRY/lib" "$CARRY/fallback"
  cp "$DIR/tests/cuda/microscale_cuda_tests" "$DIR/tests/cuda/microscale_cuda_bench" "$CARRY/"
  # The libraries the binaries load beyond the C library and CUDA's own (which the GPU machine's
  # toolkit provides in its version) go along: the C++ runtime only as a fallback, since a newer
  # one there serves these binaries and everything else on the machine.
  local libs
  libs=$(ldd "$CARRY"/microscale_cuda_* | awk '/=> \// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcudart|libcublas|libcublasLt)\.so')
  for f in $libs; do
    case $(basename "$f") in
      libstdc++* | libgcc_s*) cp -L "$f" "$CARRY/fallback/" ;;
      *) cp -L "$f" "$CARRY/lib/" ;;
    esac
  done
  ls -l "$CARRY" "$CARRY/lib" "$CARRY/fallback"
  set +e
}

# The library path for the carried binaries (never exported: torch must keep its own): the
# carried libraries, the CUDA libraries wherever the machine has them (toolkit, or the nvidia-*
# wheels torch brings), and the carried C++ runtime only if the binaries do not start without it.
library_path() {
  local p=$PWD/$CARRY/lib
  for lib in libcudart.so.13 libcublasLt.so.13 libcublas.so.13; do
    if ! ldconfig -p | grep -q "$lib"; then
      local f
      f=$(find /usr/local /opt /usr/lib -name "$lib" -print -quit 2>/dev/null)
      [ -n "$f" ] && p=$p:$(dirname "$f")
    fi
  done
  if ! LD_LIBRARY_PATH=$p "$CARRY/microscale_cuda_tests" --gtest_list_tests >/dev/null 2>&1; then
    p=$p:$PWD/$CARRY/fallback
  fi
  echo "$p"
}

run() {
  OUT=${OUT:-$PWD/gpu-check-out}
  mkdir -p "$OUT"
  local W
  W=$(mktemp -d)
  local T=$CARRY/microscale_cuda_tests B=$CARRY/microscale_cuda_bench
  [ -x "$T" ] && [ -x "$B" ] || { echo "no $T or $B: run '$0 build $DIR' first" >&2; return 1; }
  local libpath
  libpath=$(library_path)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  with_libs() { LD_LIBRARY_PATH=$libpath "$@"; }
  local t0=$SECONDS
  stamp() { echo "==== $* [+$((SECONDS - t0)) s]"; }

  stamp environment
  {
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
    nvcc --version 2>&1 | tail -1 || true
    lscpu | grep -m1 'Model name' || true
    echo "LD_LIBRARY_PATH for the binaries: $libpath"
    with_libs ldd "$T" "$B"
    command -v compute-sanitizer || true
    ls -d /usr/include/hwy /usr/include/gtest 2>&1 || true
  } >"$W/environment.txt" 2>&1
  cat "$W/environment.txt"

  stamp tests
  with_libs timeout 150 "$T" --gtest_output=json:"$W/tests.json" >"$W/tests.log" 2>&1
  echo "rc=$?" >>"$W/tests.log"
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|^rc=' "$W/tests.log" | tail -30

  stamp benchmark
  with_libs timeout 120 "$B" --iters 50 --json "$W/bench.json" >"$W/bench.log" 2>&1
  echo "rc=$?" >>"$W/bench.log"
  cat "$W/bench.log"

  stamp "peers (torch, torchao)"
  (
    if ls .whl/*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$W/site" .whl/*.whl &&
        export PYTHONPATH=$W/site
    fi
    PYTHONUNBUFFERED=1 timeout 90 python3 bench/cuda_peers.py --iters 50 --json "$W/peers.json"
    echo "rc=$?"
  ) >"$W/peers.log" 2>&1
  cat "$W/peers.log"

  stamp "compute-sanitizer (four tools at once)"
  local san
  san=$(command -v compute-sanitizer || find /usr/local /opt -name compute-sanitizer -type f -print -quit 2>/dev/null)
  if [ -n "$san" ]; then
    sanitize() {  # tool filter [options...]
      local tool=$1 filter=$2
      shift 2
      with_libs timeout 200 "$san" --tool "$tool" --error-exitcode 1 "$@" "$T" --gtest_filter="$filter" >"$W/$tool.log" 2>&1
      echo "rc=$?" >>"$W/$tool.log"
    }
    sanitize memcheck "${MEMCHECK_FILTER:-Gpu.*}" --leak-check full &
    sanitize racecheck "${RACECHECK_FILTER:-Gpu.QuantizedMatmul*:Gpu.Qqmm*:Gpu.GatherQmm*}" &
    sanitize initcheck "${INITCHECK_FILTER:-Gpu.Quantize*:Gpu.QuantizedMatmul*:Gpu.Amax*}" &
    sanitize synccheck "${SYNCCHECK_FILTER:-Gpu.QuantizedMatmul*:Gpu.Qqmm*}" &
    wait
    for tool in memcheck racecheck initcheck synccheck; do
      echo "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$W/$tool.log" | tail -1) $(tail -1 "$W/$tool.log")"
    done
  else
    echo "compute-sanitizer not found" | tee "$W/memcheck.log"
  fi

  stamp summary
  python3 - "$W" >"$W/summary.json" <<'EOF'
import json, os, re, sys
w = sys.argv[1]
def read(name):
    p = os.path.join(w, name)
    return open(p, errors="replace").read() if os.path.exists(p) else ""
def load(name):
    try:
        return json.loads(read(name))
    except ValueError:
        return None
def rc(text):
    m = re.findall(r"^rc=(\d+)$", text, re.M)
    return int(m[-1]) if m else None
s = {"environment": read("environment.txt").splitlines()[:8]}
t = load("tests.json")
if t:
    cases = [c for suite in t["testsuites"] for c in suite["testsuite"]]
    s["tests"] = {
        "total": len(cases),
        "failed": [c["classname"] + "." + c["name"] for c in cases if c.get("failures")],
        "skipped": [c["classname"] + "." + c["name"] for c in cases if c.get("result") == "SKIPPED"],
        "seconds": t.get("time"),
    }
s["tests_rc"] = rc(read("tests.log"))
s["bench"] = load("bench.json")
s["bench_rc"] = rc(read("bench.log"))
s["peers"] = load("peers.json")
s["peers_rc"] = rc(read("peers.log"))
san = {}
for tool in ("memcheck", "racecheck", "initcheck", "synccheck"):
    text = read(tool + ".log")
    summary = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: .*", text)
    ran = re.findall(r"^\[==========\] (\d+) tests? from .* ran", text, re.M)
    san[tool] = {"rc": rc(text), "summary": summary[-1] if summary else None,
                 "tests_ran": int(ran[-1]) if ran else None,
                 "tests_passed": len(re.findall(r"^\[       OK \]", text, re.M))}
s["sanitizers"] = san
json.dump(s, sys.stdout, indent=1)
EOF
  cp "$W/summary.json" "$OUT/"
  for f in tests.json bench.json peers.json; do [ -f "$W/$f" ] && cp "$W/$f" "$OUT/"; done
  tar -C "$W" -czf "$OUT/logs.tgz" --exclude=site .
  # Nsight Compute last, after the summary is safe under $OUT: one report per NAME:SKIP, of the
  # kernel matching NAME after SKIP earlier matches in one benchmark pass (--iters 1: three
  # warm-ups and one timed call per configuration).
  if [ -n "${NCU_KERNELS:-}" ] && command -v ncu >/dev/null; then
    for spec in $NCU_KERNELS; do
      stamp "ncu $spec"
      with_libs timeout 90 ncu --clock-control none -k "regex:${spec%%:*}" --launch-skip "${spec#*:}" -c 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        --section Occupancy --section WarpStateStats "$B" --iters 1 >>"$W/ncu.log" 2>&1
      echo "rc=$?" >>"$W/ncu.log"
    done
    grep -E '^  [a-z_ ]+.*\(.*\)x\(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Issue Slots Busy' \
      "$W/ncu.log"
    tar -C "$W" -czf "$OUT/logs.tgz" --exclude=site .
  fi
  stamp done
  python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
t = s.get("tests") or {}
print("tests:", t.get("total"), "failed:", t.get("failed"), "skipped:", len(t.get("skipped", [])), "rc:", s["tests_rc"])
for k, v in s["sanitizers"].items(): print(k, v)
' "$W/summary.json"
}

case $mode in
  build) build ;;
  run) run ;;
  auto)
    [ -x "$CARRY/microscale_cuda_tests" ] || build
    run
    ;;
esac
