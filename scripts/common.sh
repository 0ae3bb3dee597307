# Shared by run.sh and test.sh: step headers and idempotent installation of the system packages.
# Sourced, not executed.

step() { printf '\n==== %s ====\n' "$*"; }

APT_PACKAGES=(build-essential cmake ninja-build pkg-config libgtest-dev libbenchmark-dev libhwy-dev
              nlohmann-json3-dev libcli11-dev)

# Installs the apt packages that are missing; runs apt-get update only when something is.
ensure_apt_packages() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "apt packages: all present"
    return
  fi
  echo "apt packages missing: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
}

# Number of parallel jobs for builds and ctest.
jobs() { nproc 2>/dev/null || echo 2; }
