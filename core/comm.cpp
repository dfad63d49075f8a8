// Backend-independent parts of core/comm.h: Work, the argument checks every
// backend shares, launcher detection and the runtime that owns MPI.
#include "core/comm.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>

#include <mpi.h>
#include <unistd.h>

#include "core/cli.h"

namespace st {

// --- Work ----------------------------------------------------------------------

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    wait_noexcept();  // the collective this handle tracked must not be orphaned
    impl_ = std::move(other.impl_);
    error_ = std::move(other.error_);
    error_reported_ = other.error_reported_;
  }
  return *this;
}

Work::~Work() { wait_noexcept(); }

void Work::wait() {
  if (impl_) {
    // Take the Impl first: it is waited at most once even when that throws,
    // and later calls see the stored failure instead.
    std::unique_ptr<Impl> impl = std::move(impl_);
    try {
      impl->wait();
    } catch (...) {
      error_ = std::current_exception();
    }
  }
  if (error_) {
    error_reported_ = true;
    std::rethrow_exception(error_);
  }
}

bool Work::is_completed() {
  if (!impl_) return true;
  try {
    return impl_->test();
  } catch (...) {
    // A failed test is a finished collective; wait() reports the failure.
    error_ = std::current_exception();
    impl_.reset();
    return true;
  }
}

void Work::wait_noexcept() noexcept {
  bool already_reported = error_reported_;
  try {
    wait();
  } catch (const std::exception& e) {
    if (!already_reported)
      std::fprintf(stderr, "shardtrain: a collective failed and nobody waited for it: %s\n", e.what());
  } catch (...) {
    if (!already_reported) std::fprintf(stderr, "shardtrain: a collective failed and nobody waited for it\n");
  }
}

std::ostream& operator<<(std::ostream& os, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return os << "Sum";
    case ReduceOp::Avg: return os << "Avg";
    case ReduceOp::Max: return os << "Max";
  }
  return os << "ReduceOp(" << static_cast<int>(op) << ")";
}

// --- argument checks shared by the backends -------------------------------------

namespace {

void check_defined(const char* op, const char* name, const Tensor& t, int rank) {
  ST_CHECK(t.defined(), "{}: {} is an undefined tensor (rank {})", op, name, rank);
}

void check_same_kind(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b,
                     int rank) {
  ST_CHECK(a.dtype() == b.dtype(), "{}: {} is {} but {} is {}; both must have the same dtype (rank {})", op, a_name,
           a.dtype(), b_name, b.dtype(), rank);
  ST_CHECK(a.device() == b.device(),
           "{}: {} is on {} but {} is on {}; all tensors of one call share a device (rank {})", op, a_name, a.device(),
           b_name, b.device(), rank);
}

void check_reduce_op(const char* op, ReduceOp reduce, DType dtype, bool max_allowed, int rank) {
  ST_CHECK(max_allowed || reduce != ReduceOp::Max, "{}: op {} is not supported, use Sum or Avg (rank {})", op, reduce,
           rank);
  // Integer averages would truncate differently from what a caller dividing
  // the sum would choose, so the caller decides.
  ST_CHECK(!(reduce == ReduceOp::Avg && dtype == DType::I32),
           "{}: Avg of an I32 tensor is not supported (integer division would truncate); use Sum and divide "
           "(rank {})",
           op, rank);
}

void check_counts(const char* op, const char* counts_name, std::span<const int64_t> counts, const char* tensor_name,
                  const Tensor& t, int size, int rank) {
  ST_CHECK(static_cast<int64_t>(counts.size()) == size, "{}: {} has {} entries, expected size() = {} (rank {})", op,
           counts_name, counts.size(), size, rank);
  int64_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    ST_CHECK(counts[r] >= 0, "{}: {}[{}] = {} is negative (rank {})", op, counts_name, r, counts[r], rank);
    total += counts[r];
  }
  ST_CHECK(t.numel() == total, "{}: {} has {} elements, expected sum({}) = {} (rank {})", op, tensor_name, t.numel(),
           counts_name, total, rank);
}

}  // namespace

void ProcessGroup::check_all_gather(const Tensor& out, const Tensor& in) const {
  const char* op = "all_gather";
  check_defined(op, "out", out, rank());
  check_defined(op, "in", in, rank());
  check_same_kind(op, "out", out, "in", in, rank());
  ST_CHECK(out.numel() == size() * in.numel(),
           "{}: out has {} elements, expected size()*in.numel() = {}*{} = {} (rank {})", op, out.numel(), size(),
           in.numel(), size() * in.numel(), rank());
}

void ProcessGroup::check_reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp reduce) const {
  const char* op = "reduce_scatter";
  check_defined(op, "out", out, rank());
  check_defined(op, "in", in, rank());
  check_same_kind(op, "out", out, "in", in, rank());
  check_reduce_op(op, reduce, out.dtype(), /*max_allowed=*/false, rank());
  ST_CHECK(in.numel() == size() * out.numel(),
           "{}: in has {} elements, expected size()*out.numel() = {}*{} = {} (rank {})", op, in.numel(), size(),
           out.numel(), size() * out.numel(), rank());
}

void ProcessGroup::check_all_reduce(const Tensor& t, ReduceOp reduce) const {
  check_defined("all_reduce", "t", t, rank());
  check_reduce_op("all_reduce", reduce, t.dtype(), /*max_allowed=*/true, rank());
}

void ProcessGroup::check_broadcast(const Tensor& t, int root) const {
  check_defined("broadcast", "t", t, rank());
  ST_CHECK(root >= 0 && root < size(), "broadcast: root {} is not a rank of this group of size {} (rank {})", root,
           size(), rank());
}

void ProcessGroup::check_all_to_allv(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in,
                                     std::span<const int64_t> send_counts) const {
  const char* op = "all_to_allv";
  check_defined(op, "out", out, rank());
  check_defined(op, "in", in, rank());
  check_same_kind(op, "out", out, "in", in, rank());
  check_counts(op, "send_counts", send_counts, "in", in, size(), rank());
  check_counts(op, "recv_counts", recv_counts, "out", out, size(), rank());
  // The one pairing a rank can check alone; the others surface inside MPI.
  auto self = static_cast<size_t>(rank());
  ST_CHECK(send_counts[self] == recv_counts[self],
           "{}: send_counts[{}] = {} but recv_counts[{}] = {}; what a rank sends itself must match what it expects "
           "(rank {})",
           op, self, send_counts[self], self, recv_counts[self], rank());
}

// --- launcher detection ---------------------------------------------------------

namespace {

/// nullopt when `name` is unset; throws when it is set to anything but a
/// decimal integer >= min_value (no sign, no spaces).
std::optional<int> env_int(const char* name, int min_value) {
  const char* raw = std::getenv(name);
  if (raw == nullptr) return std::nullopt;
  std::string_view text(raw);
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  bool ok =
      !text.empty() && text[0] != '-' && ec == std::errc() && end == text.data() + text.size() && value >= min_value;
  ST_CHECK(ok, "environment variable {}='{}' is not an integer >= {}; the launcher's environment is malformed", name,
           text, min_value);
  return value;
}

/// The first of `names` that is set, with its name; nullopt when none is.
struct EnvValue {
  const char* name;
  int value;
};
std::optional<EnvValue> first_env_int(std::initializer_list<const char*> names, int min_value) {
  for (const char* name : names) {
    if (auto v = env_int(name, min_value)) return EnvValue{name, *v};
  }
  return std::nullopt;
}

/// The value of `name` when it is a plain decimal integer, else nullopt (never
/// throws: a RANK=abc set for something else is no launcher's).
std::optional<long> env_count(const char* name) {
  const char* raw = std::getenv(name);
  if (raw == nullptr) return std::nullopt;
  std::string_view text(raw);
  long value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

/// Refuses an environment that describes several processes without an MPI
/// world to join them: torchrun's RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE,
/// or Slurm tasks (srun without --mpi, or a batch script of several tasks).
/// Each such process would initialise MPI as a world of one and work alone on
/// the same files.
void refuse_world_without_mpi() {
  for (const char* mpi : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (std::getenv(mpi) != nullptr) return;
  }
  struct Launcher {
    const char* name;
    const char* task;                  // set in each process it starts (nullptr: any of the others)
    std::array<const char*, 2> sizes;  // more than 1: several processes
    std::array<const char*, 2> ranks;  // more than 0: not the only process
  };
  // An salloc shell has SLURM_NTASKS but no SLURM_PROCID: it is one process, not a task.
  for (const Launcher& l :
       {Launcher{"torchrun", nullptr, {"WORLD_SIZE", "LOCAL_WORLD_SIZE"}, {"RANK", "LOCAL_RANK"}},
        Launcher{"Slurm", "SLURM_PROCID", {"SLURM_NTASKS", "SLURM_NPROCS"}, {"SLURM_PROCID", nullptr}}}) {
    if (l.task != nullptr && std::getenv(l.task) == nullptr) continue;
    std::string seen;  // "WORLD_SIZE=2, RANK=1"
    long processes = 0;
    bool several = false;
    for (const char* name : l.sizes) {
      const std::optional<long> v = name ? env_count(name) : std::nullopt;
      if (!v) continue;
      seen += format("{}{}={}", seen.empty() ? "" : ", ", name, *v);
      several = several || *v > 1;
      processes = std::max(processes, *v);
    }
    for (const char* name : l.ranks) {
      const std::optional<long> v = name ? env_count(name) : std::nullopt;
      if (!v) continue;
      seen += format("{}{}={}", seen.empty() ? "" : ", ", name, *v);
      several = several || *v > 0;
    }
    const std::string n = processes > 1 ? format("{}", processes) : std::string("N");
    ST_CHECK(!several,
             "this process was started as one of {} processes by {} ({}), but there is no MPI world (none of "
             "OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMI_RANK or PMIX_RANK is set): each process would run alone, on the "
             "same files. Launch through MPI: scripts/launch -np {} PROGRAM ... (mpirun), or srun --mpi=pmix",
             processes > 1 ? n : std::string("several"), l.name, seen, n);
  }
}

}  // namespace

WorldInfo detect_world() {
  refuse_world_without_mpi();
  std::optional<EnvValue> rank, size, local_rank, local_size;
  if (auto r = env_int("OMPI_COMM_WORLD_RANK", 0), s = env_int("OMPI_COMM_WORLD_SIZE", 1); r || s) {
    ST_CHECK(r && s, "Open MPI launch: {} is set but {} is not", r ? "OMPI_COMM_WORLD_RANK" : "OMPI_COMM_WORLD_SIZE",
             r ? "OMPI_COMM_WORLD_SIZE" : "OMPI_COMM_WORLD_RANK");
    rank = EnvValue{"OMPI_COMM_WORLD_RANK", *r};
    size = EnvValue{"OMPI_COMM_WORLD_SIZE", *s};
    local_rank = first_env_int({"OMPI_COMM_WORLD_LOCAL_RANK"}, 0);
    local_size = first_env_int({"OMPI_COMM_WORLD_LOCAL_SIZE"}, 1);
  } else if ((rank = first_env_int({"PMIX_RANK", "PMI_RANK"}, 0))) {
    // PMIx publishes no size variable; under srun --mpi=pmix SLURM does.
    size = first_env_int({"PMI_SIZE", "SLURM_NTASKS"}, 1);
    ST_CHECK(size, "{}={} is set but neither PMI_SIZE nor SLURM_NTASKS gives the world size", rank->name, rank->value);
    local_rank = first_env_int({"MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID"}, 0);
    local_size = first_env_int({"MPI_LOCALNRANKS", "PMI_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"}, 1);
  } else if ((rank = first_env_int({"SLURM_PROCID"}, 0))) {
    size = first_env_int({"SLURM_NTASKS"}, 1);
    ST_CHECK(size, "SLURM_PROCID={} is set but SLURM_NTASKS is not", rank->value);
    local_rank = first_env_int({"SLURM_LOCALID"}, 0);
    local_size = first_env_int({"SLURM_NTASKS_PER_NODE"}, 1);
  } else {
    return WorldInfo{};
  }

  WorldInfo info;
  info.launched = true;
  info.rank = rank->value;
  info.size = size->value;
  info.local_rank = local_rank ? local_rank->value : info.rank;
  info.local_size = local_size ? local_size->value : info.size;
  ST_CHECK(info.rank < info.size, "launcher environment: rank {} ({}) is not below the world size {} ({})", info.rank,
           rank->name, info.size, size->name);
  ST_CHECK(info.local_size <= info.size, "launcher environment: local size {} ({}) exceeds the world size {} ({})",
           info.local_size, local_size ? local_size->name : "default", info.size, size->name);
  ST_CHECK(info.local_rank < info.local_size,
           "launcher environment: local rank {} ({}) is not below the local size {} ({})", info.local_rank,
           local_rank ? local_rank->name : "default", info.local_size, local_size ? local_size->name : "world size");
  return info;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

// --- runtime ----------------------------------------------------------------------

CommRuntime::CommRuntime(CommBackend backend) : info_(detect_world()) {
  if (backend == CommBackend::Auto) backend = info_.launched || info_.size > 1 ? CommBackend::Mpi : CommBackend::Local;
  if (backend == CommBackend::Local) {
    ST_CHECK(info_.size == 1,
             "the local backend runs one process, but the launcher started {} (this is rank {}); use CommBackend::Mpi "
             "or Auto",
             info_.size, info_.rank);
    world_ = make_local_group();
    return;
  }

  // MPI can be initialised once per process and never again after
  // MPI_Finalize, so a second owner is a bug to report, not to paper over.
  int initialized = 0;
  int finalized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  MPI_CHECK(MPI_Finalized(&finalized));
  ST_CHECK(!finalized,
           "MPI was already finalized in this process and cannot be initialised again; create one "
           "CommRuntime for the life of the process");
  ST_CHECK(!initialized,
           "MPI is already initialised in this process (a second CommRuntime, or another library called "
           "MPI_Init); exactly one CommRuntime owns MPI");
  int provided = -1;
  MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
  mpi_initialized_ = true;
  mpi_thread_provided_ = provided;
  // From here a throw leaves MPI un-finalised on purpose: MPI_Finalize could
  // block on ranks that went on, while an exit without it makes the launcher
  // end the whole job.
  world_ = make_mpi_world_group();
  if (info_.launched) {
    ST_CHECK(world_->size() == info_.size && world_->rank() == info_.rank,
             "the launcher's environment says rank {} of {}, but MPI_COMM_WORLD says rank {} of {}; start the "
             "processes with the launcher MPI was built for (mpirun, or srun with --mpi)",
             info_.rank, info_.size, world_->rank(), world_->size());
  }
  info_.rank = world_->rank();
  info_.size = world_->size();
  if (!info_.launched) {
    info_.local_rank = 0;
    info_.local_size = 1;
  }
}

void finalize_mpi_for_agreed_error() {
  int initialized = 0;
  int finalized = 0;
  if (MPI_Initialized(&initialized) != MPI_SUCCESS || !initialized) return;
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
  MPI_Finalize();
}

AgreedErrors agreed_errors_of_job() {
  AgreedErrors agreed;
  agreed.reporter = [] {
    try {
      return detect_world().rank == 0;
    } catch (const Error&) {
      return true;  // a world it cannot read: report rather than stay silent
    }
  };
  agreed.quiet_exit = finalize_mpi_for_agreed_error;
  return agreed;
}

CommRuntime::~CommRuntime() {
  world_.reset();  // the world communicator goes before MPI does
  if (!mpi_initialized_) return;
  // Unwinding from an error: the other ranks may wait in a collective this
  // rank never joins, and MPI_Finalize would wait for them. Skipping it makes
  // the launcher tear the job down instead of hanging.
  if (std::uncaught_exceptions() > 0) return;
  int finalized = 0;
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
  int rc = MPI_Finalize();
  if (rc != MPI_SUCCESS)
    std::fprintf(stderr, "shardtrain: MPI_Finalize failed: %s\n", detail::mpi_error_string(rc).c_str());
}

namespace {
constexpr size_t kMaxStringBytes = size_t{1} << 30;
int64_t words_for(int64_t bytes) { return std::max<int64_t>((bytes + 3) / 4, 1); }
}  // namespace

std::string broadcast_string(ProcessGroup& group, const std::string& text, int root) {
  ST_CHECK(text.size() < kMaxStringBytes, "broadcast_string: {} bytes is too long to send", text.size());
  Tensor length = Tensor::from_vector(std::vector<int32_t>{static_cast<int32_t>(text.size())}, {1});
  group.broadcast(length, {.root = root}).wait();
  const int64_t n = length.data<int32_t>()[0];
  Tensor words = Tensor::zeros({words_for(n)}, DType::I32);
  if (group.rank() == root) std::memcpy(words.raw_data(), text.data(), text.size());
  group.broadcast(words, {.root = root}).wait();
  return std::string(static_cast<const char*>(words.raw_data()), static_cast<size_t>(n));
}

std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& text) {
  ST_CHECK(text.size() < kMaxStringBytes, "all_gather_strings: {} bytes is too long to send", text.size());
  const int n = group.size();
  Tensor lengths = Tensor::zeros({n}, DType::I32);
  group.all_gather(lengths, Tensor::from_vector(std::vector<int32_t>{static_cast<int32_t>(text.size())}, {1})).wait();
  std::span<const int32_t> len = lengths.span<int32_t>();
  int64_t max_words = 1;
  for (int32_t l : len) max_words = std::max(max_words, words_for(l));
  Tensor mine = Tensor::zeros({max_words}, DType::I32);
  std::memcpy(mine.raw_data(), text.data(), text.size());
  Tensor all = Tensor::zeros({n * max_words}, DType::I32);
  group.all_gather(all, mine).wait();
  std::vector<std::string> out(static_cast<size_t>(n));
  const char* base = static_cast<const char*>(all.raw_data());
  for (int r = 0; r < n; ++r) {
    out[static_cast<size_t>(r)].assign(base + r * max_words * 4, static_cast<size_t>(len[static_cast<size_t>(r)]));
  }
  return out;
}

void run_on_every_rank(ProcessGroup& group, const std::function<void()>& f) {
  std::string error;
  try {
    f();
  } catch (const Error& e) {
    error = e.message();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const std::vector<std::string> errors =
      group.size() == 1 ? std::vector<std::string>{error} : all_gather_strings(group, error);
  // The same failure on every rank (a bad file all of them read) needs no rank number.
  const bool all_same = std::all_of(errors.begin(), errors.end(), [&](const std::string& e) { return e == errors[0]; });
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    throw AgreedError(all_same ? errors[r] : format("rank {}: {}", r, errors[r]), __FILE__, __LINE__);
  }
}

}  // namespace st
