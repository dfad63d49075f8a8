#pragma once
// The training loop: the model sharded by fsdp::ShardedModel (any strategy,
// mixed precision, recomputation), the optimizer on this rank's flat shards.
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <signal.h>

#include "core/comm.h"
#include "core/log.h"
#include "launch/config.h"

namespace st::launch {

/// Run control from the command line.
struct TrainOptions {
  int64_t stop_after = 0;  // save and stop after this step (0: run to train.steps)
  std::string resume;      // auto | never | checkpoint directory; empty: auto when checkpoint.dir is set
  int local_rank = 0;      // rank among this host's processes: picks the GPU (local_rank % GPUs)
  bool overwrite = false;  // move checkpoint.dir's checkpoints aside and start from step 0
};

/// One evaluation (launch/eval.h) of a run.
struct EvalPoint {
  int64_t step = 0;  // after this step
  double loss = 0;   // validation loss, the same on every rank
};

struct TrainResult {
  std::vector<double> losses;    // per completed step, mean over the global batch
  std::vector<EvalPoint> evals;  // the evaluations of this process, in step order
  double tokens_per_s = 0;       // mean throughput over the steps after the first (samples/s for the toy model)
  int64_t num_parameters = 0;
  double mfu = -1;         // over the steps after the first; < 0 when unknown (CPU, unknown GPU)
  int64_t peak_bytes = 0;  // largest per-step peak of this rank's device allocator
};

/// The handlers of the signals that ask a run to stop, save and exit 0
/// (SIGTERM, SIGINT, SIGHUP, SIGUSR1), for the object's life. The trainer's
/// main() installs them before MPI starts, so that a stop at any phase ends
/// alike: one during start-up ends the run before step 1 (train() agrees on it
/// once set up), one during a step at its next boundary. Under scripts/launch
/// a rank starts with SIGUSR1 ignored (scripts/launch-rank) and, once these
/// handlers are in place, takes a stop the launcher relayed before then from
/// $ST_LAUNCH_SIGNAL_FILE: no moment of start-up is left where SIGUSR1 kills.
/// The signals are blocked in every thread (the object must be made before
/// any thread starts) and taken by a thread of its own (sigwait): a signal
/// then never interrupts a system call or runs a handler on a thread in the
/// middle of a GEMM (one landing in oneDNN's GEMMs under Open MPI crashed a
/// rank now and then).
class StopSignals {
 public:
  StopSignals();
  /// Stops the waiting thread and restores the signals' earlier handlers,
  /// except that SIGUSR1 is ignored from here on (a late copy of a stop must
  /// not kill a rank that is exiting 0); the signals stay blocked.
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_[4]{};  // SIGTERM, SIGINT, SIGHUP, SIGUSR1
  std::thread waiter_;         // takes the signals one by one (sigwait)
};

/// Test hook: with ST_TEST_HOLD_FOR_STOP=POINT@STEP (or POINT) in the
/// environment, a process reaching `point` (of `step`) waits until it has
/// received a stop signal, and rank 0 of the job (by the launcher's
/// environment) says so on stderr ("test hook: holding at save@3 until a
/// stop signal arrives"), so that a test sends the signal exactly in that
/// phase, whatever the machine's load. Points: start-up (before MPI starts),
/// save (before an interval save is written), step-end (after a step, before
/// the ranks agree on a stop).
void hold_for_stop_for_test(std::string_view point, int64_t step);

/// Where train.device puts this rank: cpu; cuda (GPU local_rank % visible
/// GPUs; an error naming train.device when there is none); auto = cuda when
/// a GPU is visible, else cpu.
Device resolve_device(DeviceKind kind, int local_rank);

/// Runs `config.train.steps` optimizer steps on `world`. Collective: every
/// rank calls it with the same config. Rank 0 logs and writes metrics.
/// `local_size` (ranks per host) sizes HYBRID_SHARD groups when
/// fsdp.shard_group_size is 0.
TrainResult train(const Config& config, ProcessGroup& world, Logger& log, int local_size = 1,
                  const TrainOptions& options = {});

/// Micro-batches per rank per step: global_batch / (world * micro_batch);
/// an error naming the three numbers when they do not divide.
int64_t accumulation_steps(const TrainConfig& train, int world_size);

}  // namespace st::launch
