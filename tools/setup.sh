#!/usr/bin/env bash
# Sets up archipelago on Debian 12: installs the Debian packages that are missing,
# configures and builds; then optionally runs the main job or the tests.
# Idempotent, and quick when everything is already there.
#
#   tools/setup.sh            install + build
#   tools/setup.sh run [ARGS] install + build + `archipelago run ARGS` (a mesh in one process: the default job)
#   tools/setup.sh test       install + build + every test (ctest)
#
# Environment: BUILD_DIR (default build), ARCHIPELAGO_MARCH (x86-64-v3 | native),
# WITH_TORCH=1 also installs the PyTorch reference's packages (benchmarks only),
# ARCHIPELAGO_TESTS=OFF configures a new build directory without the tests (the container image).
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
MARCH=${ARCHIPELAGO_MARCH:-x86-64-v3}
ACTION=${1:-build}
[[ $# -gt 0 ]] && shift

# Build and test dependencies, all from Debian 12 (dpkg-dev and file: cpack's .deb).
packages=(
  g++ cmake ninja-build pkg-config python3 python3-numpy
  libcaf-dev libzmq3-dev cppzmq-dev capnproto libcapnp-dev librocksdb-dev
  libeigen3-dev doctest-dev libcli11-dev libtomlplusplus-dev libxxhash-dev libcpp-httplib-dev
  nlohmann-json3-dev libsodium-dev libspdlog-dev libdnnl-dev pybind11-dev python3-dev
  dpkg-dev file
)
# What only the tests need: the one-node Slurm cluster, the network-namespace test bed,
# a browser for the dashboard test, PyTorch for the Python package's tests, the format
# check's clang-format, mmdebstrap for the package test's fresh Debian root.
if [[ $ACTION == test ]]; then
  packages+=(slurm-wlm munge iproute2 prometheus etcd-server etcd-client chromium python3-torch clang-format-14
             mmdebstrap)
fi
if [[ ${WITH_TORCH:-0} == 1 ]]; then
  packages+=(python3-torch libopenblas0-pthread libopenblas0-openmp)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [[ ! -f $BUILD_DIR/CMakeCache.txt ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DARCHIPELAGO_MARCH="$MARCH" \
    -DARCHIPELAGO_TESTS="${ARCHIPELAGO_TESTS:-ON}"
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"

case $ACTION in
  build) ;;
  run) exec "$BUILD_DIR/archipelago" run "$@" ;;
  test) exec ctest --test-dir "$BUILD_DIR" --output-on-failure "$@" ;;
  *) echo "setup: unknown action '$ACTION' (build, run or test)" >&2; exit 2 ;;
esac
