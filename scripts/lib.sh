# Shared by scripts/demo and scripts/test: install what is missing, then build.
# shellcheck shell=bash

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}

# Debian packages the build and the tests need. Only the missing ones are installed.
RR_PACKAGES=(cmake ninja-build g++ pkg-config python3 libgtest-dev libgmock-dev libbenchmark-dev
             openmpi-bin libopenmpi-dev iproute2 procps libssl-dev clang libclang-rt-14-dev
             nftables debootstrap
             # stacks of the ranks a test finds hung (scripts/cluster run's report on a timeout)
             gdb
             # the Python module, the torch backend and its tests (Debian's interpreter)
             python3-dev pybind11-dev python3-numpy python3-pytest python3-torch libtorch-dev
             python3-sklearn)

install_missing() {
  local missing=()
  for p in "${RR_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

build() {
  echo "== building in $BUILD"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  ninja -C "$BUILD" -j "$(nproc)"
}
