#pragma once
// How much memory a rank will take, against how much the rank may use, in
// two checks:
//   1. before the model is built (check_startup_memory): the state a rank
//      holds for the whole run, counted from the config alone (StatePlan:
//      master weights, gradients, optimizer state, gathered parameters, batch
//      buffers), plus the least a step can add (its activations with every
//      layer recomputed). A model or batch that cannot fit is refused before
//      any of it is allocated, saying what would fit.
//   2. once the state is allocated (check_memory_fits): the step itself
//      (MemoryPlan), against what is left.
// Plus the start-up memory line and the advice an out-of-memory error
// carries. The step's estimate counts what the layers keep for backward
// (models/model.h, ModelActivations), FSDP's gathered units and, on the CPU,
// the GEMM's widened copies of BF16 operands (blocked to a few MiB, plus a
// weight). Small per-op buffers (attention tiles, row scratch) are not
// counted.
#include <cstdint>
#include <string>

#include "core/comm.h"
#include "core/device.h"
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
  int64_t gemm_scratch_bytes = 0;  // CPU: F32 copies the GEMM makes of BF16 operands (core/cpu/ops_cpu.h), largest GEMM

  /// Activation bytes of a micro-batch of `samples` with `recomputed` layers recomputed.
  int64_t activation_bytes(int64_t samples, int64_t recomputed) const;
  /// Bytes a step adds to the start-up state at micro-batch `samples` (this run's recomputation).
  int64_t step_bytes(int64_t samples) const;
};

MemoryPlan plan_memory(const Config& config, const fsdp::MemoryReport& report, int64_t recomputed_layers);

/// What a rank holds from start-up to the end of the run, counted from the
/// config before any of it is allocated.
struct StatePlan {
  int64_t params = 0;           // the model's parameters (models::model_flops)
  int64_t world_size = 1;       // ranks in the job
  int64_t shard_ranks = 1;      // ranks each parameter is sharded over (FSDP's shard group)
  int64_t master_bytes = 0;     // this rank's F32 master-weight shards
  int64_t grad_bytes = 0;       // its F32 gradient shards
  int64_t optimizer_bytes = 0;  // the optimizer state on them (AdamW: 2 x F32, SGD: 1)
  int64_t gathered_bytes = 0;   // parameters kept gathered in param_dtype through a step (SHARD_GRAD_OP, NO_SHARD)
  int64_t batch_bytes = 0;      // the step's input and target buffers, every micro-batch of this rank

  int64_t total() const { return master_bytes + grad_bytes + optimizer_bytes + gathered_bytes + batch_bytes; }
};

/// FSDP's shard group size at `world_size` ranks, `local_size` per host
/// (world for FULL_SHARD and SHARD_GRAD_OP, 1 for NO_SHARD, HYBRID_SHARD's
/// fsdp.shard_group_size or the ranks per host). An fsdp.shard_group_size
/// that does not divide the world size is an AgreedError: one line for the job.
int64_t shard_ranks(const Config& config, int world_size, int local_size);

/// The state of `config`'s run with each parameter sharded over `shard_ranks`
/// ranks of `world_size`.
StatePlan plan_state(const Config& config, int world_size, int64_t shard_ranks);

/// Refuses (AgreedError, the same text on every rank) a run whose state plus
/// the least a step adds (activations with every layer recomputed) exceed the
/// least memory any rank has (`available`: this rank's available_bytes),
/// naming each part and what would fit: more ranks to shard over, fewer
/// layers, a smaller micro-batch.
void check_state_fits(const Config& config, const StatePlan& state, ProcessGroup& world, int64_t available);

/// Check 1 above, before the model is built: shard_ranks, plan_state and
/// check_state_fits against this rank's available_bytes. Memory on a GPU is
/// not counted here (`device` CUDA: only the shard group is checked).
void check_startup_memory(const Config& config, Device device, ProcessGroup& world, int local_size);

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
