// Stand-in for the CUDA kernels (core/cuda/*.cu) in builds without CUDA:
// the dispatchers only call these for tensors on a GPU, which such a build
// cannot create, so reaching one is a bug worth a clear message.
#include "core/cuda/ops_cuda.h"

namespace st::cuda {

namespace {
[[noreturn]] void no_cuda(const char* op) {
  ST_FAIL("op {} on a GPU tensor, but shardtrain was built without CUDA (configure with -DST_WITH_CUDA=ON)", op);
}
}  // namespace

void gemm(const Tensor&, ops::Transpose, const Tensor&, ops::Transpose, const Tensor&, int64_t, int64_t, int64_t, float,
          float) {
  no_cuda("gemm");
}

void add(const Tensor&, const Tensor&, const Tensor&) { no_cuda("add"); }

void scale(const Tensor&, float) { no_cuda("scale"); }

void axpy(float, const Tensor&, const Tensor&) { no_cuda("axpy"); }

void cast(const Tensor&, const Tensor&) { no_cuda("cast"); }

double sum_of_squares(const Tensor&) { no_cuda("sum_of_squares"); }

void fill(const Tensor&, double) { no_cuda("fill"); }

void embedding_forward(const Tensor&, const Tensor&, const Tensor&) { no_cuda("embedding_forward"); }

void embedding_backward(const Tensor&, const Tensor&, const Tensor&) { no_cuda("embedding_backward"); }

void rmsnorm_forward(const Tensor&, const Tensor&, float, const Tensor&, const Tensor&) { no_cuda("rmsnorm_forward"); }

void rmsnorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("rmsnorm_backward");
}

void rope_tables(int64_t, int64_t, double, const Tensor&, const Tensor&) { no_cuda("rope_tables"); }

void rope_forward(const Tensor&, const Tensor&, const Tensor&) { no_cuda("rope_forward"); }

void rope_backward(const Tensor&, const Tensor&, const Tensor&) { no_cuda("rope_backward"); }

void attention_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("attention_forward");
}

void attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("attention_backward");
}

void swiglu_forward(const Tensor&, const Tensor&, const Tensor&) { no_cuda("swiglu_forward"); }

void swiglu_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("swiglu_backward");
}

void relu_forward(const Tensor&, const Tensor&) { no_cuda("relu_forward"); }

void relu_backward(const Tensor&, const Tensor&, const Tensor&) { no_cuda("relu_backward"); }

ops::LossSum cross_entropy(const Tensor&, const Tensor&, int64_t, float, const Tensor&) { no_cuda("cross_entropy"); }

ops::LossSum mse(const Tensor&, const Tensor&, float, const Tensor&) { no_cuda("mse"); }

}  // namespace st::cuda
