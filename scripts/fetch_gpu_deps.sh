#!/usr/bin/env bash
# Downloads (does not install) the Debian packages that the lent GPU machine
# lacks to build shardtrain and run its tests: Open MPI with its runtime
# libraries, yaml-cpp, Eigen, nlohmann-json and GoogleTest. They land in
# .deps/debs (git-ignored); bench/gpu_bench.sh unpacks them there with
# `dpkg -x`, so nothing is installed on either machine. Run it here, where
# Debian's archive is reachable; the GPU machine has no network.
#
#   scripts/fetch_gpu_deps.sh        # then carry .deps to the device call
#
# Safe to run again: packages already in .deps/debs are not fetched twice.
# The dependency closure comes from apt-cache; what a base Ubuntu/Debian image
# (and the CUDA image, which needs a C/C++ toolchain for nvcc) already has is
# dropped, and so are the -dev packages of dependencies: building against Open
# MPI needs mpi.h and libmpi only, never hwloc's or libevent's headers.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
debs="$root/.deps/debs"
limit_mib=60

roots=(
  openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev  # mpirun, mpicxx, libmpi
  libyaml-cpp-dev libyaml-cpp0.7                         # configuration files
  libeigen3-dev                                          # CPU GEMM (header-only)
  nlohmann-json3-dev                                     # JSON (header-only)
  libgtest-dev                                           # tests (static libs, CMake config)
  libsentencepiece-dev libsentencepiece0                 # tokenizer (prepare, generate, data.tokenizer)
)

# Already on the image, or not needed at run time. One alternation per kind:
# the C library and toolchain (nvcc needs them, so they are there), system
# basics of any Debian/Ubuntu base, hwloc's optional plugins (X11, OpenCL,
# libxml2: hwloc works without them), and googletest's sources (libgtest-dev
# ships the built libraries).
drop='^(libc6|libc-dev-bin|libc6-dev|linux-libc-dev|libcrypt.*|libnsl.*|libtirpc.*|rpcsvc-proto'
drop+='|gcc.*|g\+\+.*|cpp.*|gfortran.*|flang.*|binutils.*|libbinutils|libctf.*|libgprofng0|libisl.*|libmpc.*|libmpfr.*'
drop+='|libgcc.*|libstdc\+\+.*|libasan.*|liblsan.*|libtsan.*|libubsan.*|libitm.*|libgomp.*|libcc1.*|libllvm.*|libclang.*'
drop+='|libmlir.*|libz3.*|libflang.*|libgfortran-.*-dev|autoconf|automake.*|autotools-dev|m4|libtool|libltdl-dev'
drop+='|perl.*|libperl.*|libgdbm.*|libdb5.*|debconf.*|cdebconf|dpkg|tar|install-info|debianutils|adduser|passwd'
drop+='|libpam.*|libsemanage.*|libsepol.*|libselinux.*|libaudit.*|libcap.*|libacl.*|libbz2.*|liblzma.*|libzstd.*'
drop+='|zlib1g|libpcre.*|libssl.*|libkrb.*|libk5crypto.*|libgssapi.*|libcom-err.*|libkeyutils.*|libtinfo.*'
drop+='|readline-common|libreadline.*|libncurses.*|libslang.*|libnewt.*|libtextwrap.*|libdebian-installer.*'
drop+='|openssh-client|libfido2.*|libcbor.*|libedit.*|libbsd.*|libmd0|libffi.*|libgmp.*|libjansson.*|libuuid.*|libudev.*'
drop+='|libhwloc-plugins|libxml2|libicu.*|libx11.*|libxau.*|libxcb.*|libxdmcp.*|libxext.*|libxnvctrl.*|libpciaccess.*'
drop+='|ocl-icd-libopencl1|libjs-.*|googletest|pkg-config|pkgconf.*|libpkgconf.*)$'

# The closure of the roots: every package line apt-cache prints unindented,
# minus virtual packages (<name>).
mapfile -t closure < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
  --no-replaces --no-enhances "${roots[@]}" | grep -v '^[ <]' | sort -u)

wanted=()
for p in "${closure[@]}"; do
  is_root=0
  for r in "${roots[@]}"; do [[ $p == "$r" ]] && is_root=1; done
  if ((!is_root)); then
    [[ $p =~ $drop ]] && continue
    [[ $p == *-dev ]] && continue  # headers of dependencies: not needed to build against Open MPI
  fi
  wanted+=("$p")
done

mkdir -p "$debs"
missing=()
for p in "${wanted[@]}"; do
  compgen -G "$debs/${p}_*.deb" >/dev/null || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "fetch_gpu_deps: downloading ${missing[*]}"
  # An old package list can name versions the archive no longer has: refresh once and retry.
  if ! (cd "$debs" && apt-get download -q "${missing[@]}"); then
    echo "fetch_gpu_deps: apt-get download failed; refreshing the package lists and retrying"
    apt-get update -qq
    (cd "$debs" && apt-get download -q "${missing[@]}")
  fi
else
  echo "fetch_gpu_deps: all ${#wanted[@]} packages already in $debs"
fi

# Anything in debs that is not wanted any more (an older list) would be unpacked too: say so.
for f in "$debs"/*.deb; do
  name="$(basename "$f")"
  name="${name%%_*}"
  keep=0
  for p in "${wanted[@]}"; do [[ $name == "$p" ]] && keep=1; done
  ((keep)) || echo "fetch_gpu_deps: note: $f is not in the current list (delete it if stale)"
done

total=$(du -cb "$debs"/*.deb | tail -1 | cut -f1)
printf 'fetch_gpu_deps: %d packages, %.1f MiB in %s\n' "${#wanted[@]}" "$(echo "$total / 1048576" | bc -l)" "$debs"
printf '  %s\n' "${wanted[@]}" | column -c 100
if ((total > limit_mib * 1048576)); then
  echo "fetch_gpu_deps: more than $limit_mib MiB: the working tree sent to the device machine is capped at 64 MiB" >&2
  exit 1
fi
