// Stand-in for optim/cuda/segment_ops.cu in builds without CUDA: the
// dispatcher (optim/segment_ops.cpp) only calls these for tensors on a GPU,
// which such a build cannot create, so reaching one is a bug worth a clear
// message.
#include "core/error.h"
#include "optim/cuda/segment_ops_cuda.h"

namespace st::optim::cuda {

namespace {
[[noreturn]] void no_cuda(const char* op) {
  ST_FAIL("op {} on a GPU tensor, but shardtrain was built without CUDA (configure with -DST_WITH_CUDA=ON)", op);
}
}  // namespace

void adamw_step(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                const detail::AdamWScalars&) {
  no_cuda("adamw_step");
}

double masked_sum_of_squares(const Tensor&, const Tensor&) { no_cuda("masked_sum_of_squares"); }

void masked_scale(const Tensor&, const Tensor&, float) { no_cuda("masked_scale"); }

}  // namespace st::optim::cuda
