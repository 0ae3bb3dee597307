# Shared by run.sh and test.sh: step headers and idempotent installation of the system packages.
# Sourced, not executed.

# Each header carries the time and the seconds since the first (inherited by test-arm.sh), so that a log shows
# where CI spends its time.
export MICROSCALE_STEPS_T0=${MICROSCALE_STEPS_T0:-$(date +%s)}
step() { printf '\n==== %s ==== [%s, +%d s]\n' "$*" "$(date -u +%H:%M:%S)" "$(($(date +%s) - MICROSCALE_STEPS_T0))"; }

APT_PACKAGES=(build-essential cmake ninja-build pkg-config libgtest-dev libbenchmark-dev libhwy-dev
              nlohmann-json3-dev libcli11-dev)

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# Whether package NAME[:ARCH] is installed for ARCH (default: the native one) or as Architecture
# all; `dpkg -s NAME` fails as ambiguous once NAME:arm64 is installed beside NAME.
apt_package_installed() {
  local name=${1%%:*} arch=${1#*:}
  [ "$arch" != "$1" ] || arch=$(dpkg --print-architecture)
  dpkg-query -W -f='${Architecture} ${db:Status-Abbrev}\n' "$name" 2>/dev/null | grep -qE "^($arch|all) ii"
}

# Installs the apt packages given (default: APT_PACKAGES; NAME:ARCH for a foreign architecture's)
# that are missing; runs apt-get update only when something is.
ensure_apt_packages() {
  local wanted=("$@") missing=()
  [ ${#wanted[@]} -gt 0 ] || wanted=("${APT_PACKAGES[@]}")
  for p in "${wanted[@]}"; do
    apt_package_installed "$p" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "apt packages: all present"
    return
  fi
  echo "apt packages missing: ${missing[*]}"
  as_root apt-get update
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}

# Lets dpkg install packages of a foreign architecture (e.g. arm64) unless it already does; the
# apt-get update that ensure_apt_packages runs for that architecture's missing packages follows.
ensure_dpkg_architecture() {
  dpkg --print-foreign-architectures | grep -qx "$1" && return
  echo "dpkg: adding architecture $1"
  as_root dpkg --add-architecture "$1"
}

# Number of parallel jobs for builds and ctest.
jobs() { nproc 2>/dev/null || echo 2; }

# Creates venv $1 unless it exists, then installs packages $3... unless `import $2` already works.
ensure_venv() {
  local venv=$1 imports=$2
  shift 2
  [ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
  if "$venv/bin/python" -c "import $imports" 2>/dev/null; then
    echo "$venv: $imports all present"
  else
    "$venv/bin/python" -m pip install "$@"
  fi
}
