#!/usr/bin/env bash
# Installs the Debian packages shardtrain needs (when missing), then
# configures and builds into build/. Safe to run again: it only does what is
# left to do. Extra arguments go to CMake's configure step.
#
#   scripts/setup.sh                      # Release build with tests
#   scripts/setup.sh -DST_SANITIZE=address
#
# Environment: ST_BUILD_DIR (default build), ST_JOBS (default: all cores).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${ST_BUILD_DIR:-$root/build}"
jobs="${ST_JOBS:-$(nproc)}"

# A build folder copied or moved with the checkout still names the old paths
# in its CMakeCache.txt, and CMake refuses it with a message about cache
# directories. Say what happened and what to do instead of guessing: the
# folder may hold someone's other build, so it is not removed here.
cache="$build_dir/CMakeCache.txt"
if [[ -f "$cache" ]]; then
  cached_build="$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' "$cache")"
  cached_source="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$cache")"
  here_build="$(cd "$build_dir" && pwd -P)"
  if [[ "$cached_build" != "$here_build" && "$cached_build" != "$(cd "$build_dir" && pwd)" ]] ||
    [[ "$cached_source" != "$root" && "$cached_source" != "$(cd "$root" && pwd -P)" ]]; then
    echo "setup: $build_dir was configured by another checkout (its CMakeCache.txt names source $cached_source," \
      "build $cached_build); remove it (rm -rf $build_dir) or build elsewhere" \
      "(ST_BUILD_DIR=$root/build-new scripts/setup.sh)" >&2
    exit 1
  fi
fi

# Package list: one line per need, so later issues add a line.
packages=(
  cmake ninja-build g++ pkg-config
  openmpi-bin libopenmpi-dev   # MPI process group, mpirun
  libeigen3-dev                # CPU GEMM (portable path, test reference)
  libdnnl-dev                  # CPU GEMM (oneDNN: AVX-512, AVX512_BF16, AMX)
  libyaml-cpp-dev              # configuration files
  nlohmann-json3-dev           # JSON: checkpoint indexes, metrics
  libgtest-dev                 # tests
  python3-torch python3-numpy  # numerical reference for tests (PyTorch 1.13, CPU, /usr/bin/python3)
  libsentencepiece-dev         # tokenizer: data.tokenizer, prepare --train-tokenizer, generate
  sentencepiece                # spm_train / spm_encode (tests: a model trained outside shardtrain)
  python3-sentencepiece        # tests: the PyTorch generation reference decodes with it
  librsvg2-bin                 # tests: rsvg-convert renders the plot's SVG
  fortunes                     # docs/TUTORIAL.md's text: 2.5 MB of English in /usr/share/games/fortunes
  clang libclang-rt-14-dev     # scripts/fuzz.sh, scripts/sanitize.sh address: clang 14, its fuzzer and sanitizer runtimes
  libomp-dev                   # OpenMP for the clang builds (fuzz, ASan)
  iproute2 util-linux          # scripts/cluster: hosts from network namespaces (ip netns, unshare, nsenter, flock)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install ${missing[*]}" >&2; exit 1; }
    sudo_cmd=(sudo)
  fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cmake -S "$root" -B "$build_dir" -G Ninja -DST_WERROR=ON "$@"
cmake --build "$build_dir" -j "$jobs"
