// The world-size-1 backend: a tutorial or unit-test run without a launcher.
// With one rank every reduction is the identity (Avg divides by 1, and a BF16
// value rounds to itself), so each collective is a copy or nothing, done
// before it returns. Needs no MPI.
#include "core/comm.h"

namespace st {
namespace {

class LocalGroup final : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend_name() const override { return "local"; }

  Work all_gather(const Tensor& out, const Tensor& in, const AllGatherOptions&) override {
    check_all_gather(out, in);
    out.copy_from(in);
    return Work();
  }

  Work reduce_scatter(const Tensor& out, const Tensor& in, const ReduceScatterOptions& opts) override {
    check_reduce_scatter(out, in, opts.op);
    out.copy_from(in);
    return Work();
  }

  Work all_reduce(const Tensor& t, const AllReduceOptions& opts) override {
    check_all_reduce(t, opts.op);
    return Work();
  }

  Work broadcast(const Tensor& t, const BroadcastOptions& opts) override {
    check_broadcast(t, opts.root);
    return Work();
  }

  Work all_to_allv(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in,
                   std::span<const int64_t> send_counts, const AllToAllOptions&) override {
    check_all_to_allv(out, recv_counts, in, send_counts);
    out.copy_from(in);
    return Work();
  }

  Work barrier(const BarrierOptions&) override { return Work(); }

  std::unique_ptr<ProcessGroup> split(int color, int) override {
    if (color < 0) return nullptr;
    return make_local_group();
  }
};

}  // namespace

std::unique_ptr<ProcessGroup> make_local_group() { return std::make_unique<LocalGroup>(); }

}  // namespace st
