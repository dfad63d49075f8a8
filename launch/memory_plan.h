#pragma once
// How much memory a rank's training step will take, against how much the
// rank may use: the start-up memory line, the refusal of a micro-batch that
// cannot fit (with the largest that can), and the advice an out-of-memory
// error carries. The estimate counts what the layers keep for backward
// (models/model.h, ModelActivations), FSDP's gathered units and, on the CPU,
// the GEMM's widened copies of BF16 operands (blocked to a few MiB, plus a
// weight). Small per-op buffers (attention tiles, row scratch) are not
// counted.
#include <cstdint>
#include <string>

#include "core/comm.h"
#include "fsdp/fsdp.h"
#include "launch/config.h"
#include "models/model.h"

namespace st::launch {

/// What a step needs beyond the state already allocated at start-up.
struct MemoryPlan {
  models::ModelActivations per_sample;  // one sample's activations (elements)
  int64_t compute_bytes = 4;            // bytes per element of the compute dtype (param_dtype)
  int64_t gathered_bytes = 0;           // FSDP: the largest unit gathered, held twice (prefetch) + its gradient
  int64_t recomputed_layers = 0;        // layers fsdp.activation_checkpointing recomputes
  int64_t gemm_scratch_bytes = 0;       // CPU: F32 copies the GEMM makes of BF16 operands (core/cpu/ops_cpu.h), largest GEMM

  /// Activation bytes of a micro-batch of `samples` with `recomputed` layers recomputed.
  int64_t activation_bytes(int64_t samples, int64_t recomputed) const;
  /// Bytes a step adds to the start-up state at micro-batch `samples` (this run's recomputation).
  int64_t step_bytes(int64_t samples) const;
};

MemoryPlan plan_memory(const Config& config, const fsdp::MemoryReport& report, int64_t recomputed_layers);

/// Bytes this process may still allocate: the least of its address-space and
/// data limits (less what it uses), its cgroup's room and the host's
/// MemAvailable, the last two shared by `local_ranks`; -1 when none is known.
int64_t available_bytes(int local_ranks);

/// The start-up line: activations per micro-batch with and without
/// recomputation, this run's step estimate and the memory available.
std::string memory_line(const Config& config, const MemoryPlan& plan, int64_t available);

/// Refuses (AgreedError, the same text on every rank) a micro-batch whose step
/// estimate exceeds the least memory any rank has (`available`: this rank's
/// available_bytes), naming the largest train.micro_batch_size that fits and
/// whether recomputation would.
void check_memory_fits(const Config& config, const MemoryPlan& plan, ProcessGroup& world, int64_t available);

/// What to lower after an allocation failure in `phase` of step `step`.
std::string out_of_memory_advice(const Config& config, const MemoryPlan& plan, const std::string& phase, int64_t step);

}  // namespace st::launch
