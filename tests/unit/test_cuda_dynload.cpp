// core/cuda/dynload.h: cuBLAS, cuBLASLt and NCCL looked up on first call.
// None of the functions called here needs a GPU or a driver (they describe
// the library), so this proves the loading on any machine that has the
// libraries this build found; it runs in every CUDA build.
#include <cstddef>
#include <string>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include "core/cuda/dynload.h"
#include "tests/harness/test_util.h"

#if defined(ST_WITH_NCCL)
#include <nccl.h>
#endif

namespace st {
namespace {

TEST(CudaDynload, CublasResolvesWithoutADevice) {
  EXPECT_EQ(std::string(ST_CUDA_LIB_CALL(cublasGetStatusName)(CUBLAS_STATUS_SUCCESS)), "CUBLAS_STATUS_SUCCESS");
  EXPECT_EQ(std::string(ST_CUDA_LIB_CALL(cublasGetStatusName)(CUBLAS_STATUS_NOT_INITIALIZED)),
            "CUBLAS_STATUS_NOT_INITIALIZED");
  // cublas_v2.h renames cublasCreate to cublasCreate_v2: the exported name is the one looked up.
  EXPECT_EQ(reinterpret_cast<void*>(ST_CUDA_LIB_CALL(cublasCreate)), cuda::library_symbol("cublasCreate_v2"));
}

TEST(CudaDynload, CublasLtResolvesWithoutADevice) {
  // The library that was opened has the major version of the headers this build used.
  const std::size_t version = ST_CUDA_LIB_CALL(cublasLtGetVersion)();
  EXPECT_EQ(version / 10000, std::size_t{CUBLAS_VER_MAJOR}) << "cublasLtGetVersion() = " << version;
}

TEST(CudaDynload, NcclResolvesWithoutADevice) {
#if defined(ST_WITH_NCCL)
  EXPECT_EQ(std::string(ST_CUDA_LIB_CALL(ncclGetErrorString)(ncclSuccess)), "no error");
  int version = 0;
  ASSERT_EQ(ST_CUDA_LIB_CALL(ncclGetVersion)(&version), ncclSuccess);
  EXPECT_EQ(version / 10000, NCCL_MAJOR) << "ncclGetVersion() = " << version;
#else
  GTEST_SKIP() << "this build found no NCCL";
#endif
}

TEST(CudaDynload, MissingFunctionNamesLibraryAndFunction) {
  const std::string message = test::error_of([] { (void)cuda::library_symbol("cublasLtNoSuchFunction"); });
  EXPECT_NE(message.find("cuBLASLt (libcublasLt.so."), std::string::npos) << message;
  EXPECT_NE(message.find("has no function cublasLtNoSuchFunction"), std::string::npos) << message;
  EXPECT_EQ(test::error_of([] { (void)cuda::library_symbol("cudnnCreate"); }),
            "library_symbol: cudnnCreate is not a cuBLAS, cuBLASLt or NCCL function");
}

TEST(CudaDynload, MissingLibrarySaysWhatToInstallAndWhereToPoint) {
  const std::string message = test::error_of([] {
    (void)cuda::detail::open_cuda_library("cuBLAS", "libcublas.so.99", "/nonexistent/libcublas.so",
                                          "the CUDA Toolkit's cuBLAS libraries");
  });
  EXPECT_EQ(message,
            "cannot load cuBLAS (libcublas.so.99), which GPU runs need: libcublas.so.99: cannot open shared object "
            "file: No such file or directory; install the CUDA Toolkit's cuBLAS libraries, or put the folder that "
            "holds libcublas.so.99 on LD_LIBRARY_PATH (the build found /nonexistent/libcublas.so); a CPU run "
            "(train.device: cpu) needs no CUDA library");
  EXPECT_EQ(test::error_of([] { (void)cuda::detail::open_cuda_library("NCCL", "", "", "NCCL 2"); }),
            "NCCL is needed here, but this build of shardtrain found no NCCL when it was configured");
}

TEST(CudaDynload, CallTextDropsTheLoader) {
  EXPECT_EQ(cuda::call_text("ST_CUDA_LIB_CALL(cublasLtCreate)(&handle_)"), "cublasLtCreate(&handle_)");
  EXPECT_EQ(cuda::call_text("ST_CUDA_LIB_CALL(ncclGroupEnd)()"), "ncclGroupEnd()");
  EXPECT_EQ(cuda::call_text("ST_CUDA_LIB_CALL_AS(cublasGemmStridedBatchedEx, GemmStridedBatchedEx)(h, n)"),
            "cublasGemmStridedBatchedEx(h, n)");
  EXPECT_EQ(cuda::call_text("cudaFree(p)"), "cudaFree(p)");
}

}  // namespace
}  // namespace st
