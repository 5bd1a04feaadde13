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
             # Slurm itself on the emulated cluster (scripts/cluster up --slurm, cluster.srun)
             slurmctld slurmd slurm-client munge
             # the Python module, the torch backend and its tests (Debian's interpreter)
             python3-dev pybind11-dev python3-numpy python3-pytest python3-torch libtorch-dev
             python3-sklearn
             # scripts/pip-check: pip install --no-build-isolation into a venv of Debian's python3
             python3-venv python3-pip python3-setuptools python3-wheel
             # the compiler cache every build here goes through (RR_CCACHE below)
             ccache)

# Compiler cache (Debian's ccache), shared by the builds of every clone on this machine: a clean
# clone's builds (the main one with nvcc, the two sanitizer builds, the fuzz targets: about 9 of
# scripts/test's minutes when cold) take seconds for what has not changed. Paths under the
# checkout are hashed relative to it and the build directory is not hashed, so clones in
# different directories share entries. Empty where ccache is missing (it is installed with the
# rest, but a build must not depend on it).
# Sets RR_CCACHE to cmake's launcher arguments; called before each configure (after
# install_missing, which may just have installed ccache).
RR_CCACHE=()
use_ccache() {
  RR_CCACHE=()
  command -v ccache >/dev/null 2>&1 || return 0
  export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-4G}
  RR_CCACHE=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
             -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
}

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
  use_ccache
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${RR_CCACHE[@]}" "$@" >/dev/null
  ninja -C "$BUILD" -j "$(nproc)"
}
