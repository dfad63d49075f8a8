#pragma once
// cuBLAS, cuBLASLt and NCCL are loaded when first called, not linked. A CUDA
// build runs on CPU-only machines too, and linking them made every start of
// every program map ~600 MB of libraries that a CPU run never calls
// (`trainer --help`: 0.17 s warm, 0.81 s from a cold page cache, against
// 0.006 s and 0.056 s without them; bench/RESULTS.md, "Start-up"). The CUDA runtime is linked
// statically (it opens the driver, libcuda, at its first call), so a run that
// never touches a GPU loads no CUDA library at all.
//
// Every call into the three libraries is written ST_CUDA_LIB_CALL(name)(args):
// the first call looks the function up (the library is chosen by the name's
// prefix: cublasLt..., cublas..., nccl...) and later calls go straight to it.
// Only for sources built with ST_WITH_CUDA (the call sites include the
// libraries' headers, which give each function its type).
#include <string>

namespace st::cuda {

/// The address of cuBLAS, cuBLASLt or NCCL function `name` (as the library
/// exports it: "cublasCreate_v2", not the header's "cublasCreate"). Opens the
/// library on first use, by its soname (LD_LIBRARY_PATH, the loader's cache),
/// then at the path this build was linked against. Throws st::Error naming
/// the library and how to make it findable when it cannot be opened, and the
/// function when the library lacks it (an older version than the build's).
void* library_symbol(const char* name);

/// A call written through ST_CUDA_LIB_CALL (or _AS) as its author meant it, for
/// error messages: "ST_CUDA_LIB_CALL(cublasLtCreate)(&handle_)" -> "cublasLtCreate(&handle_)".
std::string call_text(const char* written);

namespace detail {
/// Opens the library `title` ("cuBLAS") by `soname`, else at `build_path`
/// (may be ""), as library_symbol does; throws its error, which says to
/// install `install` or put the library's folder on LD_LIBRARY_PATH.
void* open_cuda_library(const char* title, const char* soname, const char* build_path, const char* install);
}  // namespace detail

}  // namespace st::cuda

/// The function `name` of cuBLAS, cuBLASLt or NCCL, looked up once (on first
/// use, thread-safely) and typed as the header declares it. The name is
/// macro-expanded before it is looked up, so cublas_v2.h's
/// `#define cublasCreate cublasCreate_v2` finds the exported symbol.
#define ST_CUDA_LIB_CALL(name) ST_CUDA_LIB_CALL_TYPED_(name, decltype(&name))
/// The same for a name that the C++ headers overload (cublas_api.h adds
/// inline C++ overloads beside some C functions): `fn_type`, a function
/// pointer type, picks the exported C function, and must match it exactly.
#define ST_CUDA_LIB_CALL_AS(name, fn_type) ST_CUDA_LIB_CALL_TYPED_(name, decltype(static_cast<fn_type>(&name)))
// decltype keeps &name unevaluated: nothing links against the library itself.
#define ST_CUDA_LIB_CALL_TYPED_(name, fn_type)                                                   \
  ([] {                                                                                          \
    static const auto st_lib_fn_ = reinterpret_cast<fn_type>(::st::cuda::library_symbol(#name)); \
    return st_lib_fn_;                                                                           \
  }())
