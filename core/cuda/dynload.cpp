#include "core/cuda/dynload.h"

#include <array>
#include <cstddef>
#include <mutex>
#include <string_view>

#include <dlfcn.h>

#include "core/error.h"

// core/CMakeLists.txt passes each library's soname and the file the build
// found; NCCL's are empty when CMake found no NCCL (comm_nccl.cpp, its only
// caller, is then not built).
#ifndef ST_NCCL_SONAME
#define ST_NCCL_SONAME ""
#define ST_NCCL_PATH ""
#endif

namespace st::cuda {

namespace {

struct LibrarySpec {
  std::string_view prefix;  // the functions it holds start with this
  const char* title;
  const char* soname;
  const char* build_path;  // the file this build found ("" when none)
  const char* install;     // what a user installs to get it
};

// cuBLASLt before cuBLAS: "cublasLt..." starts with "cublas" too, and libcublas
// needs libcublasLt, which is then found already loaded.
constexpr std::size_t kCublasLt = 0;
const std::array<LibrarySpec, 3> kLibraries = {{
    {"cublasLt", "cuBLASLt", ST_CUBLASLT_SONAME, ST_CUBLASLT_PATH, "the CUDA Toolkit's cuBLAS libraries"},
    {"cublas", "cuBLAS", ST_CUBLAS_SONAME, ST_CUBLAS_PATH, "the CUDA Toolkit's cuBLAS libraries"},
    {"nccl", "NCCL", ST_NCCL_SONAME, ST_NCCL_PATH, "NCCL 2 (the libnccl2 package, or a PyTorch wheel's nvidia/nccl)"},
}};

std::size_t library_index(std::string_view name) {
  for (std::size_t i = 0; i < kLibraries.size(); ++i)
    if (name.starts_with(kLibraries[i].prefix)) return i;
  ST_FAIL("library_symbol: {} is not a cuBLAS, cuBLASLt or NCCL function", name);
}

void* open_library(const LibrarySpec& lib) {
  return detail::open_cuda_library(lib.title, lib.soname, lib.build_path, lib.install);
}

// Opened once per process and never closed: the functions looked up stay in use.
void* library_handle(std::size_t index) {
  static std::mutex mutex;
  static std::array<void*, 3> handles{};
  std::lock_guard<std::mutex> lock(mutex);
  if (index != kCublasLt && kLibraries[index].prefix == "cublas" && handles[kCublasLt] == nullptr)
    handles[kCublasLt] = open_library(kLibraries[kCublasLt]);
  if (handles[index] == nullptr) handles[index] = open_library(kLibraries[index]);
  return handles[index];
}

}  // namespace

namespace detail {

void* open_cuda_library(const char* title, const char* soname, const char* build_path, const char* install) {
  ST_CHECK(soname[0] != '\0', "{} is needed here, but this build of shardtrain found no {} when it was configured",
           title, title);
  if (void* handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL)) return handle;
  const char* reason = dlerror();
  const std::string by_soname = reason != nullptr ? reason : "not found";
  if (build_path[0] != '\0') {
    if (void* handle = dlopen(build_path, RTLD_NOW | RTLD_LOCAL)) return handle;
  }
  ST_FAIL(
      "cannot load {} ({}), which GPU runs need: {}; install {}, or put the folder that holds {} on "
      "LD_LIBRARY_PATH (the build found {}); a CPU run (train.device: cpu) needs no CUDA library",
      title, soname, by_soname, install, soname, build_path[0] != '\0' ? build_path : "none");
}

}  // namespace detail

void* library_symbol(const char* name) {
  const std::size_t index = library_index(name);
  void* handle = library_handle(index);
  (void)dlerror();
  void* fn = dlsym(handle, name);
  ST_CHECK(fn != nullptr,
           "{} ({}) has no function {}: the library is older than the one this build was compiled against ({})",
           kLibraries[index].title, kLibraries[index].soname, name, kLibraries[index].build_path);
  return fn;
}

std::string call_text(const char* written) {
  constexpr std::string_view kMacro = "ST_CUDA_LIB_CALL";
  std::string_view rest(written);
  std::string out;
  for (std::size_t at = rest.find(kMacro); at != std::string_view::npos; at = rest.find(kMacro)) {
    out += rest.substr(0, at);
    rest.remove_prefix(at);
    // ST_CUDA_LIB_CALL(name) or ST_CUDA_LIB_CALL_AS(name, type): keep the name only.
    const std::size_t open = rest.find('(');
    const std::size_t close = rest.find(')', open);
    if (open == std::string_view::npos || close == std::string_view::npos) break;
    const std::string_view args = rest.substr(open + 1, close - open - 1);
    out += args.substr(0, args.find(','));
    rest.remove_prefix(close + 1);
  }
  out += rest;
  return out;
}

}  // namespace st::cuda
