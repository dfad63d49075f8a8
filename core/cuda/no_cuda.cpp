// Stand-in for core/cuda/runtime.cu in builds without CUDA (ST_WITH_CUDA=OFF):
// the CPU build links, and any request for a GPU fails with a clear message.
#include "core/cuda/cuda_runtime.h"
#include "core/error.h"

namespace st::cuda {

bool compiled_with_cuda() { return false; }

int device_count() { return 0; }

std::string device_name(int index) {
  ST_FAIL("cuda:{} requested, but shardtrain was built without CUDA (configure with -DST_WITH_CUDA=ON)", index);
}

void set_device(int index) {
  ST_FAIL("cuda:{} requested, but shardtrain was built without CUDA (configure with -DST_WITH_CUDA=ON)", index);
}

CacheStats cache_stats(int index) {
  ST_FAIL("cuda:{} requested, but shardtrain was built without CUDA (configure with -DST_WITH_CUDA=ON)", index);
}

void empty_cache(int index) {
  ST_FAIL("cuda:{} requested, but shardtrain was built without CUDA (configure with -DST_WITH_CUDA=ON)", index);
}

void synchronize(int index) {
  ST_FAIL("cuda:{} requested, but shardtrain was built without CUDA (configure with -DST_WITH_CUDA=ON)", index);
}

Allocator& device_allocator(int index) {
  ST_FAIL("cuda:{} requested, but shardtrain was built without CUDA (configure with -DST_WITH_CUDA=ON)", index);
}

void copy_bytes(void*, Device dst_device, const void*, Device src_device, size_t) {
  ST_FAIL("copy {} -> {} needs CUDA, but shardtrain was built without it", src_device, dst_device);
}

void zero_bytes(void*, Device device, size_t) {
  ST_FAIL("zeroing memory on {} needs CUDA, but shardtrain was built without it", device);
}

}  // namespace st::cuda
