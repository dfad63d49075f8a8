#pragma once
// A collective self-check for a freshly launched job: every ProcessGroup op
// on inputs whose exact result is known, then bus bandwidth of all_gather,
// reduce_scatter and all_reduce at one message size (nccl-tests' definition),
// and of two ranks on one host and two ranks on different hosts (when the
// job has such pairs).
#include <cstdint>
#include <string>
#include <vector>

#include "core/comm.h"
#include "core/log.h"

namespace st::launch {

struct SelfCheckResult {
  std::string name;     // "all_reduce SUM BF16"
  int64_t wrong = 0;    // elements that differ from the exact answer, summed over ranks
  int64_t checked = 0;  // elements checked, summed over ranks
};

struct BandwidthResult {
  std::string name;     // "all_gather F32", "ranks 0 <-> 2 (hosts h1 and h2)"
  int64_t bytes = 0;    // per-rank output bytes (nccl-tests' "size")
  double seconds = 0;   // mean time per call
  double bus_gbps = 0;  // bus bandwidth, GB/s
};

struct SelfCheckReport {
  std::vector<SelfCheckResult> checks;
  std::vector<BandwidthResult> bandwidth;
  bool passed() const;
};

/// Runs the checks on `group` (collective: every rank calls it) and logs a
/// table on rank 0. `bandwidth_bytes` = 0 skips the bandwidth part.
SelfCheckReport run_self_check(ProcessGroup& group, Logger& log, int64_t bandwidth_bytes);

}  // namespace st::launch
