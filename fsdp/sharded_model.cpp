// ShardedModel: flat parameters, the gather/free/reduce-scatter hooks around
// each shard unit, prefetch with the all-gather limiter, and the sharded state
// the optimizer and the checkpoint see.
//
// Life of a unit (one FlatParameter) within a step:
//   Free --issue_gather--> InFlight --wait--> Gathered --free--> Free
// Gathered weights are views of `full` (param_dtype, padded numel); gradients
// are views of `full_grad`, which exists only between the unit's pre_backward
// and post_backward and is then handed to a pending reduction.
//
// Every rank runs the same hooks in the same order, so every decision that
// issues a collective (prefetch, limiter, reduction queue) depends only on
// that order, never on a Work's completion test: MPI and NCCL require each
// communicator's collectives to be started in the same order on all its ranks.
//
// Profile (core/profile.h): forward() and backward() are the forward and
// backward phases. A recomputed unit re-runs its forward inside its backward
// without hooks around it, so its recompute time is taken as the time its
// forward took (pre_forward's gather done to post_forward), which is moved
// from backward to recompute when the backward ends.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <unordered_map>

#include "core/ops.h"
#include "core/profile.h"
#include "core/watchdog.h"
#include "fsdp/fsdp.h"

namespace st::fsdp {

namespace {

std::string unit_label(const std::string& name) { return name.empty() ? "(root)" : name; }

// Gathered units that were prefetched and not yet used: PyTorch's
// limit_all_gathers bound, which keeps prefetching from gathering the whole
// model ahead of the compute.
constexpr int kMaxPrefetched = 2;
// Reductions kept in flight after a unit's backward: the newest overlaps the
// next unit's backward, older ones are finished so their full-size gradient
// buffers do not pile up.
constexpr size_t kMaxPendingReductions = 2;

/// One parameter's part of this rank's shard.
struct Piece {
  std::string fqn;
  models::Parameter* param = nullptr;
  int64_t begin = 0;   // first flat element of the tensor held here
  int64_t count = 0;   // elements held here
  int64_t offset = 0;  // position within the shard
};

enum class GatherState : uint8_t { Free, InFlight, Gathered };

/// A unit's flat parameter: all of its parameters back to back, padded to a
/// multiple of the shard group size, of which this rank holds one shard.
struct FlatParam {
  UnitPlan plan;
  std::vector<int64_t> offsets;  // flat offset of each plan.params[i] in the padded buffer
  int64_t padded = 0;            // numel rounded up to a multiple of g
  int64_t shard_size = 0;        // padded / g
  Tensor master;                 // F32 [shard_size]: this rank's master weights
  Tensor grad;                   // F32 [shard_size]: this rank's reduced gradients
  std::vector<Piece> pieces;

  GatherState state = GatherState::Free;
  Tensor full;              // param_dtype [padded] while gathered
  Tensor full_grad;         // param_dtype [padded] between pre_backward and post_backward
  Work gather_work;         // the in-flight all_gather into `full`
  bool prefetched = false;  // gathered ahead of use; counts against the limiter
  // Profile only: when this unit's forward compute began, and how long it took.
  std::chrono::steady_clock::time_point forward_start{};
  double forward_seconds = 0;
};

enum class Phase : uint8_t { Idle, Forward, Backward };

enum class ReductionStage : uint8_t { Scatter, AllReduce, Ready };

/// A unit's gradient on its way into the F32 gradient shard.
struct PendingReduction {
  size_t unit = 0;
  Tensor shard;  // reduce_dtype [shard_size]: the reduce-scatter's output, then all-reduced in place
                 // (alone: the unit's BF16 gradient itself, see start_reduction)
  Work work;     // keeps the full-size gradient alive until the scatter is done
  ReductionStage stage = ReductionStage::Ready;
};

}  // namespace

struct ShardedModel::Impl {
  class UnitHooks final : public models::ModuleHooks {
   public:
    UnitHooks(Impl& impl, size_t unit) : impl_(impl), unit_(unit) {}
    void pre_forward(models::Module&) override { impl_.pre_forward(unit_); }
    void post_forward(models::Module&) override { impl_.post_forward(unit_); }
    void pre_backward(models::Module&) override { impl_.pre_backward(unit_); }
    void post_backward(models::Module&) override { impl_.post_backward(unit_); }

   private:
    Impl& impl_;
    size_t unit_;
  };

  models::Module& model;
  FsdpConfig config;
  ProcessGroup& world;
  Logger& log;
  Device device;
  int g = 1;
  DType param_dtype = DType::F32;
  DType reduce_dtype = DType::F32;
  // Declared before everything that may hold a Work, so communicators outlive them.
  std::unique_ptr<ProcessGroup> shard_group;
  std::unique_ptr<ProcessGroup> replica_group;

  std::vector<UnitPlan> plans;
  std::vector<FlatParam> units;
  std::vector<std::unique_ptr<UnitHooks>> hooks;
  std::vector<optim::Segment> segments;
  std::vector<std::string> fqn_order;  // model.named_parameters() order, for full_parameters()
  size_t root_unit = SIZE_MAX;         // the unit rooted at the model itself, if any

  Phase phase = Phase::Idle;
  std::vector<size_t> forward_order;   // pre_forward order of the first forward
  std::vector<size_t> backward_order;  // pre_backward order of the first backward
  bool forward_order_known = false;
  bool backward_order_known = false;
  std::deque<PendingReduction> pending;
  // Per unit, what the watchdog reports a hang in: {"forward of unit X", "backward of unit X"}.
  std::vector<std::array<std::string, 2>> activity;
  double recompute_seconds = 0;  // profile: recomputed units' forward time within this backward

  Impl(models::Module& model_, const FsdpConfig& config_, ProcessGroup& world_, int local_size, uint64_t seed,
       Logger& log_, Device device_)
      : model(model_), config(config_), world(world_), log(log_), device(device_) {
    const bool by_host =
        config.sharding_strategy == ShardingStrategy::HybridShard && config.shard_group_size == 0 && world.size() > 1;
    const HostPlace place = by_host ? host_place() : HostPlace{};
    g = shard_group_size_for(local_size);
    param_dtype = config.mixed_precision.param_dtype;
    reduce_dtype = config.mixed_precision.reduce_dtype;
    plans = plan_units(model, config.auto_wrap);

    const int rank = world.rank();
    // HYBRID_SHARD per host: shard group = the ranks on this host, replica group = the ranks at
    // the same place on every host, whatever order the launcher gave the ranks (--map-by node).
    // (A launcher that reports fewer ranks per host than a host runs splits each host into groups of that many.)
    const int groups_per_host = place.ranks_per_host / g;
    shard_group = world.split(by_host ? place.host * groups_per_host + place.place / g : rank / g, rank);
    replica_group = world.split(by_host ? place.place % g : rank % g, rank);
    ST_CHECK(shard_group && shard_group->size() == g, "fsdp: shard group of rank {} has {} ranks, expected {}", rank,
             shard_group ? shard_group->size() : 0, g);

    for (const auto& entry : model.named_parameters()) fqn_order.push_back(entry.first);
    units.reserve(plans.size());
    for (const UnitPlan& plan : plans) build_unit(plan, seed);
    // Checked before any hook goes in: a constructor that throws runs no
    // destructor, so hooks installed by then would point into freed memory.
    for (const FlatParam& unit : units) {
      ST_CHECK(unit.plan.module->hooks() == nullptr,
               "fsdp: module '{}' already has hooks (is the model wrapped by another ShardedModel?)",
               unit_label(unit.plan.name));
    }
    for (size_t u = 0; u < units.size(); ++u) {
      activity.push_back(
          {"forward of unit " + unit_label(units[u].plan.name), "backward of unit " + unit_label(units[u].plan.name)});
      if (units[u].plan.module == &model) root_unit = u;
      hooks.push_back(std::make_unique<UnitHooks>(*this, u));
      units[u].plan.module->set_hooks(hooks.back().get());
    }
  }

  ~Impl() {
    // Never throws: Work's destructor waits without throwing, and the rest
    // only drops handles.
    pending.clear();
    for (FlatParam& unit : units) {
      unit.gather_work = Work();
      unit.plan.module->set_hooks(nullptr);
      for (auto& [fqn, p] : unit.plan.params) {
        p->value = Tensor();
        p->grad = Tensor();
      }
    }
  }

  struct HostPlace {
    int ranks_per_host = 1;
    int host = 0;   // index of this rank's host, in the order of each host's lowest rank
    int place = 0;  // this rank's position among the ranks of its host
  };
  // Collective: where this rank sits among the hosts (by host name). Every
  // rank sees the same names, so an uneven job fails alike on every rank.
  HostPlace host_place() const {
    const int rank = world.rank();
    const std::vector<std::string> hosts = all_gather_strings(world, host_name());
    std::vector<std::string> distinct;
    std::map<std::string, int> count;
    HostPlace out;
    for (int r = 0; r < world.size(); ++r) {
      const std::string& h = hosts[static_cast<size_t>(r)];
      if (std::find(distinct.begin(), distinct.end(), h) == distinct.end()) distinct.push_back(h);
      if (r == rank) {
        out.host = static_cast<int>(std::find(distinct.begin(), distinct.end(), h) - distinct.begin());
        out.place = count[h];
      }
      ++count[h];
    }
    out.ranks_per_host = count[distinct.front()];
    std::string counts;
    bool even = true;
    for (const std::string& h : distinct) {
      counts += format("{}{} on {}", counts.empty() ? "" : ", ", count[h], h);
      even = even && count[h] == out.ranks_per_host;
    }
    if (!even)
      throw AgreedError(format("HYBRID_SHARD shards within each host (fsdp.shard_group_size 0), so every host needs "
                               "the same number of ranks; this job has {}: start as many on every host, or set "
                               "fsdp.shard_group_size",
                               counts),
                        __FILE__, __LINE__);
    return out;
  }

  int shard_group_size_for(int local_size) const {
    const int n = world.size();
    int64_t size = 1;
    switch (config.sharding_strategy) {
      case ShardingStrategy::FullShard:
      case ShardingStrategy::ShardGradOp: size = n; break;
      case ShardingStrategy::NoShard: size = 1; break;
      case ShardingStrategy::HybridShard:
        size = config.shard_group_size == 0 ? local_size : config.shard_group_size;
        ST_CHECK(size >= 1, "fsdp.shard_group_size must be >= 1 (or 0 for ranks per host), got {} (rank {})", size,
                 world.rank());
        ST_CHECK(n % size == 0, "fsdp.shard_group_size ({}{}) must divide the world size ({})", size,
                 config.shard_group_size == 0 ? ", the ranks per host" : "", n);
        break;
    }
    return static_cast<int>(size);
  }

  void build_unit(const UnitPlan& plan, uint64_t seed) {
    FlatParam unit;
    unit.plan = plan;
    int64_t numel = 0;
    for (const auto& [fqn, p] : plan.params) {
      unit.offsets.push_back(numel);
      numel += shape_numel(p->shape);
    }
    unit.padded = (numel + g - 1) / g * g;
    unit.shard_size = unit.padded / g;
    // Initialised on the host (the seeded init is CPU code), then moved.
    Tensor master = Tensor::zeros({unit.shard_size}, DType::F32);  // padding stays zero forever
    unit.grad = Tensor::zeros({unit.shard_size}, DType::F32, device);
    const int64_t lo = shard_group->rank() * unit.shard_size;
    const int64_t hi = lo + unit.shard_size;
    optim::Segment segment;
    segment.grad = unit.grad;
    for (size_t i = 0; i < plan.params.size(); ++i) {
      const auto& [fqn, p] = plan.params[i];
      const int64_t start = unit.offsets[i];
      const int64_t end = start + shape_numel(p->shape);
      const int64_t a = std::max(start, lo), b = std::min(end, hi);
      p->value = Tensor();  // the unit owns the storage from here on
      p->grad = Tensor();
      if (a >= b) continue;
      Piece piece{fqn, p, a - start, b - a, a - lo};
      models::init_parameter_slice(*p, fqn, seed, piece.begin, master.flat_slice(piece.offset, piece.count));
      segment.ranges.push_back({fqn, piece.offset, piece.count, p->weight_decay});
      unit.pieces.push_back(std::move(piece));
    }
    unit.master = device.is_cpu() ? master : master.to(device);
    segment.param = unit.master;
    if (device.is_cuda()) segment.device_ranges = optim::range_table(segment);  // once, not per step
    segments.push_back(std::move(segment));
    units.push_back(std::move(unit));
  }

  // --- gather / free ------------------------------------------------------------

  void issue_gather(FlatParam& unit) {
    unit.full = Tensor::empty({unit.padded}, param_dtype, device);
    if (g == 1) {
      ops::cast(unit.master, unit.full);
      unit.state = GatherState::Gathered;
      return;
    }
    // The cast goes straight into this rank's slot of the full buffer, which
    // then serves as the in-place send buffer: no separate staging copy.
    Tensor slot = unit.full.flat_slice(shard_group->rank() * unit.shard_size, unit.shard_size);
    ops::cast(unit.master, slot);
    unit.gather_work = shard_group->all_gather(unit.full, slot);
    unit.state = GatherState::InFlight;
  }

  void wait_gather(FlatParam& unit) {
    if (unit.state != GatherState::InFlight) return;
    unit.gather_work.wait();
    unit.gather_work = Work();  // the Work holds the buffer too: drop it so free() really frees
    unit.state = GatherState::Gathered;
  }

  void ensure_gathered(size_t u) {
    FlatParam& unit = units[u];
    if (unit.state == GatherState::Free) issue_gather(unit);
    wait_gather(unit);
    unit.prefetched = false;
    for (size_t i = 0; i < unit.plan.params.size(); ++i) {
      models::Parameter* p = unit.plan.params[i].second;
      p->value = unit.full.flat_slice(unit.offsets[i], shape_numel(p->shape)).view(p->shape);
    }
  }

  void free_unit(size_t u) {
    FlatParam& unit = units[u];
    wait_gather(unit);  // MPI may still write into the buffer
    unit.full = Tensor();
    unit.full_grad = Tensor();
    unit.state = GatherState::Free;
    unit.prefetched = false;
    for (auto& [fqn, p] : unit.plan.params) {
      p->value = Tensor();
      p->grad = Tensor();
    }
  }

  void prefetch(size_t u) {
    FlatParam& unit = units[u];
    if (unit.state != GatherState::Free) return;
    if (config.limit_all_gathers) {
      int ahead = 0;
      for (const FlatParam& other : units) ahead += other.prefetched ? 1 : 0;
      if (ahead >= kMaxPrefetched) return;
    }
    issue_gather(unit);
    unit.prefetched = true;
  }

  /// The unit after `u` in `order`, or SIZE_MAX.
  static size_t next_in(const std::vector<size_t>& order, size_t u) {
    auto it = std::find(order.begin(), order.end(), u);
    if (it == order.end() || ++it == order.end()) return SIZE_MAX;
    return *it;
  }

  bool frees_after_forward(size_t u) const {
    const ShardingStrategy s = config.sharding_strategy;
    // The root unit stays gathered until backward, as in PyTorch: its
    // backward starts right after the forward ends.
    return (s == ShardingStrategy::FullShard || s == ShardingStrategy::HybridShard) && u != root_unit;
  }

  bool frees_after_backward() const { return config.sharding_strategy != ShardingStrategy::NoShard; }

  // --- hooks ----------------------------------------------------------------------

  void pre_forward(size_t u) {
    if (Watchdog* w = world.watchdog()) w->set_activity(&activity[u][0]);
    const bool recording = phase == Phase::Forward && !forward_order_known;
    if (recording && std::find(forward_order.begin(), forward_order.end(), u) == forward_order.end()) {
      forward_order.push_back(u);
    }
    ensure_gathered(u);
    if (profile::current() && phase == Phase::Forward) units[u].forward_start = std::chrono::steady_clock::now();
    // Forward hooks also fire inside backward when a recomputed module holds
    // unit roots; prefetching in forward order there would gather units that
    // backward does not need next.
    if (phase == Phase::Forward && forward_order_known && config.forward_prefetch) {
      const size_t next = next_in(forward_order, u);
      if (next != SIZE_MAX) prefetch(next);
    }
  }

  void post_forward(size_t u) {
    if (profile::current() && phase == Phase::Forward) {
      units[u].forward_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - units[u].forward_start).count();
    }
    if (frees_after_forward(u)) free_unit(u);
  }

  void pre_backward(size_t u) {
    if (Watchdog* w = world.watchdog()) w->set_activity(&activity[u][1]);
    if (phase == Phase::Backward && !backward_order_known &&
        std::find(backward_order.begin(), backward_order.end(), u) == backward_order.end()) {
      backward_order.push_back(u);
    }
    ensure_gathered(u);
    FlatParam& unit = units[u];
    if (is_recomputed(*unit.plan.module)) recompute_seconds += unit.forward_seconds;
    unit.full_grad = Tensor::zeros({unit.padded}, param_dtype, device);
    for (size_t i = 0; i < unit.plan.params.size(); ++i) {
      models::Parameter* p = unit.plan.params[i].second;
      p->grad = unit.full_grad.flat_slice(unit.offsets[i], shape_numel(p->shape)).view(p->shape);
    }
    // BACKWARD_PRE: the next unit's gather overlaps this unit's backward. Until
    // the first backward has shown the real order, the reverse forward order
    // is the best guess.
    size_t next = SIZE_MAX;
    if (backward_order_known) {
      next = next_in(backward_order, u);
    } else if (forward_order_known) {
      std::vector<size_t> reversed(forward_order.rbegin(), forward_order.rend());
      next = next_in(reversed, u);
    }
    if (next != SIZE_MAX && phase == Phase::Backward) prefetch(next);
  }

  void post_backward(size_t u) {
    start_reduction(u);
    if (frees_after_backward()) {
      free_unit(u);
    } else {
      for (auto& [fqn, p] : units[u].plan.params) p->grad = Tensor();
    }
  }

  // --- gradient reduction ---------------------------------------------------------

  void start_reduction(size_t u) {
    FlatParam& unit = units[u];
    Tensor grad = unit.full_grad;
    unit.full_grad = Tensor();
    for (auto& [fqn, p] : unit.plan.params) p->grad = Tensor();
    // Alone (one rank, nothing exchanged), a BF16 gradient bound for F32 needs
    // no cast pass of its own: complete()'s axpy widens it exactly as the cast
    // would. Collectives take the reduce dtype.
    const bool exchanged = g > 1 || replica_group->size() > 1;
    const bool widened_by_axpy = !exchanged && grad.dtype() == DType::BF16 && reduce_dtype == DType::F32;
    if (grad.dtype() != reduce_dtype && !widened_by_axpy) grad = ops::cast(grad, reduce_dtype);

    PendingReduction r;
    r.unit = u;
    if (g > 1) {
      r.shard = Tensor::empty({unit.shard_size}, reduce_dtype, device);
      r.work = shard_group->reduce_scatter(r.shard, grad);  // the Work keeps `grad` alive
      r.stage = ReductionStage::Scatter;
    } else if (replica_group->size() > 1) {
      r.shard = grad;  // g == 1: the shard is the whole padded buffer
      r.work = replica_group->all_reduce(r.shard);
      r.stage = ReductionStage::AllReduce;
    } else {
      r.shard = grad;
      r.stage = ReductionStage::Ready;
    }
    pending.push_back(std::move(r));
    // Move older reductions on to their all-reduce; finish the oldest so at
    // most kMaxPendingReductions full-size gradients are held.
    for (size_t i = 0; i + 1 < pending.size(); ++i) advance(pending[i]);
    while (pending.size() > kMaxPendingReductions) {
      complete(pending.front());
      pending.pop_front();
    }
  }

  void advance(PendingReduction& r) {
    if (r.stage != ReductionStage::Scatter) return;
    r.work.wait();
    r.work = Work();  // releases the full-size gradient
    if (replica_group->size() > 1) {
      r.work = replica_group->all_reduce(r.shard);
      r.stage = ReductionStage::AllReduce;
    } else {
      r.stage = ReductionStage::Ready;
    }
  }

  void complete(PendingReduction& r) {
    advance(r);
    if (r.stage == ReductionStage::AllReduce) {
      r.work.wait();
      r.work = Work();
      r.stage = ReductionStage::Ready;
    }
    // += so that micro-batches accumulate; the trainer's 1/count loss scale
    // already makes the SUM a mean.
    ops::axpy(1.0f, r.shard, units[r.unit].grad);
    r.shard = Tensor();
  }

  void finish_grad_sync() {
    while (!pending.empty()) {
      complete(pending.front());
      pending.pop_front();
    }
  }

  void zero_grad() {
    finish_grad_sync();
    // Gathered copies kept across steps (NO_SHARD, or a forward without a
    // backward) predate the optimizer step that follows: drop them.
    for (size_t u = 0; u < units.size(); ++u) free_unit(u);
    for (FlatParam& unit : units) unit.grad.zero_();
  }

  // --- queries --------------------------------------------------------------------

  double grad_norm_squared() {
    finish_grad_sync();
    double local = 0;
    for (const optim::Segment& segment : segments) local += optim::grad_sum_of_squares(segment);
    if (g == 1) return local;  // replicas hold identical shards: nothing to add
    // No F64 on the wire: send the double as hi + lo floats, sum in rank
    // order in double, so the norm does not depend on how MPI combines.
    const auto hi = static_cast<float>(local);
    const auto lo = static_cast<float>(local - static_cast<double>(hi));
    Tensor mine = Tensor::from_vector(std::vector<float>{hi, lo}, {2}).to(device);
    Tensor all = Tensor::empty({2 * static_cast<int64_t>(g)}, DType::F32, device);
    shard_group->all_gather(all, mine).wait();
    const std::vector<float> v = all.to_floats();
    double total = 0;
    for (int r = 0; r < g; ++r) total += static_cast<double>(v[2 * r]) + static_cast<double>(v[2 * r + 1]);
    return total;
  }

  std::vector<StateEntry> master_entries() const {
    std::vector<Tensor> masters;
    for (const FlatParam& unit : units) masters.push_back(unit.master);
    return shard_entries(masters, "master");
  }

  std::vector<StateEntry> shard_entries(const std::vector<Tensor>& per_unit, const std::string& kind) const {
    ST_CHECK(per_unit.size() == units.size(), "shard_entries({}): {} buffers for {} units", kind, per_unit.size(),
             units.size());
    std::vector<StateEntry> entries;
    for (size_t u = 0; u < units.size(); ++u) {
      const FlatParam& unit = units[u];
      ST_CHECK(per_unit[u].numel() == unit.shard_size && per_unit[u].dtype() == DType::F32,
               "shard_entries({}): buffer {} is {}, expected F32 [{}]", kind, u, per_unit[u].str(), unit.shard_size);
      for (const Piece& piece : unit.pieces) {
        entries.push_back({piece.fqn, kind, piece.param->shape, DType::F32, piece.begin,
                           per_unit[u].flat_slice(piece.offset, piece.count)});
      }
    }
    return entries;
  }

  std::vector<std::pair<std::string, std::vector<float>>> full_parameters() {
    std::unordered_map<std::string, std::vector<float>> by_fqn;
    for (FlatParam& unit : units) {
      Tensor full = unit.master;
      if (g > 1) {
        full = Tensor::empty({unit.padded}, DType::F32, device);
        shard_group->all_gather(full, unit.master).wait();
      }
      const std::vector<float> host = full.to_floats();
      const float* data = host.data();
      for (size_t i = 0; i < unit.plan.params.size(); ++i) {
        const auto& [fqn, p] = unit.plan.params[i];
        const float* begin = data + unit.offsets[i];
        by_fqn[fqn] = std::vector<float>(begin, begin + shape_numel(p->shape));
      }
    }
    std::vector<std::pair<std::string, std::vector<float>>> out;
    for (const std::string& fqn : fqn_order) {
      auto it = by_fqn.find(fqn);
      if (it != by_fqn.end()) out.emplace_back(fqn, std::move(it->second));
    }
    return out;
  }

  MemoryReport memory_report() const {
    MemoryReport report;
    for (const FlatParam& unit : units) {
      report.master_bytes += static_cast<int64_t>(unit.master.nbytes());
      report.grad_bytes += static_cast<int64_t>(unit.grad.nbytes());
      report.largest_gathered_bytes =
          std::max(report.largest_gathered_bytes, unit.padded * static_cast<int64_t>(dtype_size(param_dtype)));
    }
    return report;
  }
};

ShardedModel::ShardedModel(models::Module& model, const FsdpConfig& config, ProcessGroup& world, int local_size,
                           uint64_t seed, Logger& log, Device device)
    : impl_(std::make_unique<Impl>(model, config, world, local_size, seed, log, device)) {}

ShardedModel::~ShardedModel() = default;

namespace {

/// Sets the phase the hooks see for one forward or backward and restores Idle
/// even when the model throws.
class PhaseScope {
 public:
  PhaseScope(Phase& phase, Phase now) : phase_(phase) { phase_ = now; }
  ~PhaseScope() { phase_ = Phase::Idle; }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Phase& phase_;
};

}  // namespace

Tensor ShardedModel::forward(const Tensor& x) {
  Impl& m = *impl_;
  const profile::PhaseScope timed(profile::Phase::Forward);
  PhaseScope scope(m.phase, Phase::Forward);
  Tensor y = m.model.forward(x);
  m.forward_order_known = true;  // only a forward that completed defines the order
  return y;
}

void ShardedModel::backward(const Tensor& dy) {
  Impl& m = *impl_;
  PhaseScope scope(m.phase, Phase::Backward);
  m.recompute_seconds = 0;
  {
    const profile::PhaseScope timed(profile::Phase::Backward);
    m.model.backward(dy);
  }
  if (profile::Profiler* p = profile::current())
    p->move_phase_time(profile::Phase::Backward, profile::Phase::Recompute, m.recompute_seconds);
  m.backward_order_known = true;
}

void ShardedModel::zero_grad() { impl_->zero_grad(); }
void ShardedModel::release() {
  for (size_t u = 0; u < impl_->units.size(); ++u) impl_->free_unit(u);
  impl_->model.release_saved_recursive();
}
void ShardedModel::finish_grad_sync() { impl_->finish_grad_sync(); }
const std::vector<optim::Segment>& ShardedModel::segments() const { return impl_->segments; }
double ShardedModel::grad_norm_squared() { return impl_->grad_norm_squared(); }
std::vector<StateEntry> ShardedModel::master_entries() const { return impl_->master_entries(); }
std::vector<StateEntry> ShardedModel::shard_entries(const std::vector<Tensor>& per_segment,
                                                    const std::string& kind) const {
  return impl_->shard_entries(per_segment, kind);
}
std::vector<std::pair<std::string, std::vector<float>>> ShardedModel::full_parameters() {
  return impl_->full_parameters();
}
MemoryReport ShardedModel::memory_report() const { return impl_->memory_report(); }
const std::vector<UnitPlan>& ShardedModel::units() const { return impl_->plans; }
int ShardedModel::shard_group_size() const { return impl_->g; }

void ShardedModel::log_memory_table(int64_t optimizer_bytes) const {
  const Impl& m = *impl_;
  Logger& log = m.log;
  size_t width = 6;
  for (const FlatParam& unit : m.units) width = std::max(width, unit_label(unit.plan.name).size());
  // The name column fits the longest unit name; format() takes no runtime width.
  const std::string row = "  {:<" + std::to_string(width) + "}  {:>12}  {:>12}";
  log.info0("fsdp units ({}, shard groups of {}, {} replica(s)):", to_string(m.config.sharding_strategy), m.g,
            m.replica_group->size());
  log.info0(row, "unit", "parameters", "padded");
  for (const FlatParam& unit : m.units) log.info0(row, unit_label(unit.plan.name), unit.plan.numel, unit.padded);
  MemoryReport r = memory_report();
  r.optimizer_bytes = optimizer_bytes;
  log.info0("per-rank memory: master {}, grads {}, optimizer {}, largest gathered unit {} ({})",
            human_bytes(r.master_bytes), human_bytes(r.grad_bytes), human_bytes(r.optimizer_bytes),
            human_bytes(r.largest_gathered_bytes), precision_name(m.config.mixed_precision.param_dtype));
}

}  // namespace st::fsdp
