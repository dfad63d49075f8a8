#pragma once
// ProcessGroup: collectives over a group of ranks, in the style of PyTorch
// c10d. Each collective takes a small options struct and returns a Work that
// is complete after wait(); a failure inside the collective is rethrown by
// wait(). Buffers must stay alive and untouched until then.
//
// Dtypes: F32, BF16, I32. BF16 SUM/AVG are summed in F32 and rounded to BF16
// once, so the result does not depend on the number of ranks or the order in
// which a backend combines them. All tensors of one call share a device.
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace st {

struct AgreedErrors;  // core/cli.h

class Watchdog;

enum class ReduceOp : uint8_t { Sum, Avg, Max };
std::ostream& operator<<(std::ostream& os, ReduceOp op);

struct AllGatherOptions {};
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::Sum;  // Sum or Avg
};
struct AllReduceOptions {
  ReduceOp op = ReduceOp::Sum;  // Sum, Avg or Max
};
struct BroadcastOptions {
  int root = 0;  // rank (within this group) whose data is sent
};
struct AllToAllOptions {};
struct BarrierOptions {};

/// Completion handle of a collective. Move-only. wait() blocks until the
/// collective is done and rethrows its failure; the destructor waits too but
/// never throws (a failure there is logged to stderr).
class Work {
 public:
  /// The backend's side of a Work.
  class Impl {
   public:
    virtual ~Impl() = default;
    /// Blocks until done; throws on failure. Called at most once.
    virtual void wait() = 0;
    /// Non-blocking completion test.
    virtual bool test() = 0;
  };

  /// An already-completed Work.
  Work() = default;
  explicit Work(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Work(Work&&) noexcept = default;
  Work& operator=(Work&& other) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work();

  /// Blocks until the collective finished; rethrows its error. Idempotent.
  void wait();
  /// True when wait() would not block.
  bool is_completed();

 private:
  void wait_noexcept() noexcept;
  std::unique_ptr<Impl> impl_;
  std::exception_ptr error_;     // the failure, kept so every wait() rethrows it
  bool error_reported_ = false;  // rethrown by wait() at least once: the destructor stays quiet
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  /// This process's rank in the group, 0..size()-1.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "mpi", "local" or "nccl".
  virtual std::string backend_name() const = 0;

  /// True when this group's ranks run on more than one host (host names
  /// compared once, when the group is made). The MPI backend only; the local
  /// and NCCL backends answer false.
  virtual bool spans_hosts() const { return false; }
  /// Payload bytes this rank has handed to collectives on groups that span
  /// hosts, summed over this group and every group split from it (directly or
  /// not), which share one counter. Per collective, the bytes of the send
  /// buffer this rank gives MPI: all_gather its `in`; reduce_scatter its whole
  /// `in`; all_reduce `t`; broadcast `t` on the root, nothing elsewhere;
  /// all_to_allv its whole `in` (the pieces for itself included); barrier
  /// nothing. BF16 Sum/Avg travel as F32 (see comm_mpi.cpp), so count 4 bytes
  /// an element. Point-to-point traffic (the watchdog's heartbeats) is not
  /// counted, nor what MPI adds on the wire (headers, the relaying of a
  /// tree or ring algorithm). The MPI backend only; the others answer 0.
  virtual int64_t cross_host_bytes() const { return 0; }

  /// The watchdog that blocking waits of this group (and of groups split from
  /// it later) report to; nullptr for none. It must outlive the group's use.
  void set_watchdog(Watchdog* watchdog) { watchdog_ = watchdog; }
  Watchdog* watchdog() const { return watchdog_; }

  /// out[r*n .. (r+1)*n) = rank r's `in` (n = in.numel(); out.numel() = size()*n).
  virtual Work all_gather(const Tensor& out, const Tensor& in, const AllGatherOptions& opts = {}) = 0;
  /// out = op over ranks of in[rank*n .. (rank+1)*n) (n = out.numel(); in.numel() = size()*n).
  /// op is Sum or Avg.
  virtual Work reduce_scatter(const Tensor& out, const Tensor& in, const ReduceScatterOptions& opts = {}) = 0;
  /// In place: t = op over ranks of t (Sum, Avg or Max).
  virtual Work all_reduce(const Tensor& t, const AllReduceOptions& opts = {}) = 0;
  /// In place: t = root's t.
  virtual Work broadcast(const Tensor& t, const BroadcastOptions& opts = {}) = 0;
  /// Personalised exchange. `in` holds the pieces for ranks 0..size()-1 back
  /// to back, send_counts[r] elements each; `out` receives rank r's piece for
  /// this rank at offset sum(recv_counts[0..r)). Counts are elements and may
  /// be zero; sizes of in/out must equal the sums of the counts.
  virtual Work all_to_allv(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in,
                           std::span<const int64_t> send_counts, const AllToAllOptions& opts = {}) = 0;
  virtual Work barrier(const BarrierOptions& opts = {}) = 0;
  /// A sub-group of the ranks that pass the same `color`, ordered by `key`
  /// (ties by rank). Collective over this group. A negative color takes no
  /// part and gets nullptr.
  virtual std::unique_ptr<ProcessGroup> split(int color, int key) = 0;

 protected:
  // Argument checks shared by every backend, so an error reads the same
  // whichever backend raised it. Each throws st::Error naming the op, the
  // sizes and this rank, e.g. "all_gather: out has 10 elements, expected
  // size()*in.numel() = 4*3 = 12 (rank 1)". Tensors must be defined and share
  // dtype and device; Avg is refused for I32 (integer division would truncate).
  void check_all_gather(const Tensor& out, const Tensor& in) const;
  void check_reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) const;
  void check_all_reduce(const Tensor& t, ReduceOp op) const;
  void check_broadcast(const Tensor& t, int root) const;
  void check_all_to_allv(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in,
                         std::span<const int64_t> send_counts) const;

 private:
  Watchdog* watchdog_ = nullptr;
};

/// Where this process sits, read from the launcher's environment
/// (Open MPI's OMPI_COMM_WORLD_*, else PMI_*/PMIX_*, else SLURM_*, else 1 process).
/// A variable that is set but not a non-negative integer, or values that
/// contradict each other (rank >= size), throw st::Error naming the variable.
/// So does an environment of several processes with no MPI world to join them
/// (torchrun's RANK/WORLD_SIZE/LOCAL_RANK, or a Slurm task, SLURM_PROCID, of
/// SLURM_NTASKS > 1 without PMI/PMIx): each would run alone as a world of one.
/// Without a local rank/size from the launcher, all ranks count as one host.
struct WorldInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // rank among the processes on this host: picks the GPU
  int local_size = 1;
  bool launched = false;  // true when a launcher (mpirun, srun) started us
};
WorldInfo detect_world();

/// This machine's host name (gethostname), "?" when it cannot be read.
std::string host_name();

enum class CommBackend : uint8_t { Auto, Local, Mpi };

/// Owns the communication runtime (MPI_Init_thread / MPI_Finalize when MPI is
/// used) for the life of the process. Create one in main() and pass world().
class CommRuntime {
 public:
  /// Auto: MPI when launched by a launcher or when size > 1, else Local.
  explicit CommRuntime(CommBackend backend = CommBackend::Auto);
  ~CommRuntime();
  CommRuntime(const CommRuntime&) = delete;
  CommRuntime& operator=(const CommRuntime&) = delete;

  ProcessGroup& world() { return *world_; }
  const WorldInfo& info() const { return info_; }
  /// The thread support MPI_Init_thread provided (MPI_THREAD_SINGLE ..
  /// MPI_THREAD_MULTIPLE, which is requested); -1 when MPI is not used.
  int mpi_thread_provided() const { return mpi_thread_provided_; }

 private:
  WorldInfo info_;
  bool mpi_initialized_ = false;
  int mpi_thread_provided_ = -1;
  std::unique_ptr<ProcessGroup> world_;
};

/// `text` of rank `root`, on every rank of `group` (collective). Strings travel
/// as their length, then their bytes packed into I32 words.
std::string broadcast_string(ProcessGroup& group, const std::string& text, int root = 0);
/// Every rank's `text`, indexed by rank (collective).
std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& text);

/// For a rank other than 0 that leaves on an error every rank agreed on (rank
/// 0 reports it): finalizes MPI when it is running. MPI_Finalize waits for
/// every rank, and rank 0 exits without it, so this rank never ends before
/// rank 0 has written its line; an exit without MPI_Finalize would make
/// mpirun end the job at once, rank 0 with it, sometimes before the line.
void finalize_mpi_for_agreed_error();

/// run_main's agreed-error mode for a program mpirun may start several times:
/// rank 0 by the launcher's environment (detect_world, so it works before MPI
/// starts) reports the error; the others finalize MPI and exit 0.
AgreedErrors agreed_errors_of_job();

/// Runs `f` on every rank of `group` and agrees on its outcome (collective):
/// when it throws on any rank, every rank throws the same st::AgreedError
/// with the message of the lowest failing rank, prefixed "rank r: " unless
/// every rank failed with that same message. So no rank goes on alone into a collective that
/// the failed rank will never join, and main() prints the error once.
void run_on_every_rank(ProcessGroup& group, const std::function<void()>& f);

/// A world-size-1 group: every collective is a copy (or nothing) and completes at once.
std::unique_ptr<ProcessGroup> make_local_group();
/// The MPI_COMM_WORLD group; MPI must be initialised (CommRuntime does it).
std::unique_ptr<ProcessGroup> make_mpi_world_group();

/// True when this build includes the NCCL backend (CUDA builds with NCCL found).
bool nccl_available();
/// A group over the ranks of `bootstrap` whose collectives run on GPU `device`
/// through NCCL ("nccl" backend): the unique id travels over `bootstrap`
/// (collective over it). Tensors must live on that GPU. Collectives run on the
/// group's own stream, ordered after the work already issued to the GPU's
/// compute stream; Work::wait() orders the compute stream after the
/// collective (the host does not block), so compute overlaps communication.
/// Throws when built without NCCL.
std::unique_ptr<ProcessGroup> make_nccl_group(ProcessGroup& bootstrap, int device);

}  // namespace st
