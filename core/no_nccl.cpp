// Stand-in for core/comm_nccl.cpp in builds without NCCL: the CPU build links,
// and asking for the NCCL backend fails with a clear message.
#include "core/comm.h"

namespace st {

bool nccl_available() { return false; }

std::unique_ptr<ProcessGroup> make_nccl_group(ProcessGroup&, int device) {
  ST_FAIL(
      "the NCCL backend for cuda:{} was requested, but shardtrain was built without NCCL (it needs CUDA and "
      "nccl.h/libnccl; configure with -DST_NCCL_ROOT=DIR)",
      device);
}

}  // namespace st
