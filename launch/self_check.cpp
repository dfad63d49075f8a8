#include "launch/self_check.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/dtype.h"

namespace st::launch {

namespace {

// Values used below stay small integers, exact in every dtype (|x| <= 256 for BF16).
Tensor make(int64_t n, DType dtype, auto&& value_of) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(value_of(i));
  return Tensor::from_floats(v, {n}, dtype);
}

// Expected values are computed in double and rounded once to the tensor's dtype.
int64_t count_wrong(const Tensor& t, auto&& expected_of) {
  std::vector<float> got = t.to_floats();
  int64_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    float want = static_cast<float>(expected_of(static_cast<int64_t>(i)));
    if (t.dtype() == DType::BF16) want = round_to_bf16(want);
    if (!(got[i] == want)) ++wrong;
  }
  return wrong;
}

class Checker {
 public:
  Checker(ProcessGroup& group, SelfCheckReport& report) : group_(group), report_(report) {}

  void record(std::string name, int64_t wrong, int64_t checked) {
    // Sum over ranks so every rank reports the same verdict.
    Tensor counts =
        Tensor::from_vector(std::vector<int32_t>{static_cast<int32_t>(wrong), static_cast<int32_t>(checked)}, {2});
    group_.all_reduce(counts, {.op = ReduceOp::Sum}).wait();
    report_.checks.push_back({std::move(name), counts.data<int32_t>()[0], counts.data<int32_t>()[1]});
  }

  static constexpr int64_t kElements = 7;  // odd, so nothing lines up by accident

  void run_dtype(DType dtype) {
    run_reductions(dtype);
    run_moves(dtype);
  }

  // reduce_scatter and all_reduce, with every op they take for `dtype`.
  void run_reductions(DType dtype) {
    const int p = group_.size();
    const int r = group_.rank();
    const std::string dt(dtype_name(dtype));
    const int64_t n = kElements;
    {  // reduce_scatter SUM/AVG: in[j] = r + j % 5 (AVG is refused for I32: integer division would truncate)
      const std::vector<ReduceOp> ops = dtype == DType::I32 ? std::vector<ReduceOp>{ReduceOp::Sum}
                                                            : std::vector<ReduceOp>{ReduceOp::Sum, ReduceOp::Avg};
      for (ReduceOp op : ops) {
        Tensor in = make(p * n, dtype, [&](int64_t j) { return r + j % 5; });
        Tensor out = Tensor::zeros({n}, dtype);
        group_.reduce_scatter(out, in, {.op = op}).wait();
        const double rank_sum = p * (p - 1) / 2.0;
        record(format("reduce_scatter {} {}", op, dt),
               count_wrong(out,
                           [&](int64_t i) {
                             double s = rank_sum + p * ((r * n + i) % 5);
                             return op == ReduceOp::Sum ? s : s / p;
                           }),
               out.numel());
      }
    }
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {  // all_reduce: t[i] = (r + i) % 4 - 1
      Tensor t = make(n, dtype, [&](int64_t i) { return (r + i) % 4 - 1; });
      group_.all_reduce(t, {.op = op}).wait();
      record(format("all_reduce {} {}", op, dt),
             count_wrong(t,
                         [&](int64_t i) {
                           double s = 0, m = -1e9;
                           for (int q = 0; q < p; ++q) {
                             double v = (q + i) % 4 - 1;
                             s += v;
                             m = std::max(m, v);
                           }
                           return op == ReduceOp::Sum ? s : m;
                         }),
             t.numel());
    }
  }

  // all_gather, broadcast and all_to_allv: data moved, not combined.
  void run_moves(DType dtype) {
    const int p = group_.size();
    const int r = group_.rank();
    const std::string dt(dtype_name(dtype));
    const int64_t n = kElements;
    {  // all_gather: out[q*n + i] = q * 10 + i
      Tensor in = make(n, dtype, [&](int64_t i) { return r * 10 + i; });
      Tensor out = Tensor::zeros({p * n}, dtype);
      group_.all_gather(out, in).wait();
      record("all_gather " + dt, count_wrong(out, [&](int64_t j) { return (j / n) * 10 + j % n; }), out.numel());
    }
    {  // broadcast from the last rank
      const int root = p - 1;
      Tensor t = make(n, dtype, [&](int64_t i) { return r * 3 + i; });
      group_.broadcast(t, {.root = root}).wait();
      record("broadcast " + dt, count_wrong(t, [&](int64_t i) { return root * 3 + i; }), t.numel());
    }
    {  // all_to_allv: rank r sends (q + r + 1) % 3 elements (0, 1 or 2) to rank q, valued r*10+q
      std::vector<int64_t> send(p), recv(p);
      for (int q = 0; q < p; ++q) {
        send[q] = (q + r + 1) % 3;
        recv[q] = (r + q + 1) % 3;
      }
      std::vector<float> in_v, want;
      for (int q = 0; q < p; ++q) in_v.insert(in_v.end(), send[q], static_cast<float>(r * 10 + q));
      for (int q = 0; q < p; ++q) want.insert(want.end(), recv[q], static_cast<float>(q * 10 + r));
      Tensor in = Tensor::from_floats(in_v, {static_cast<int64_t>(in_v.size())}, dtype);
      Tensor out = Tensor::zeros({static_cast<int64_t>(want.size())}, dtype);
      group_.all_to_allv(out, recv, in, send).wait();
      record("all_to_allv " + dt, count_wrong(out, [&](int64_t j) { return want[static_cast<size_t>(j)]; }),
             out.numel());
    }
  }

  void run_split() {
    // Even and odd ranks form two groups; each sums its members' ranks.
    auto sub = group_.split(group_.rank() % 2, group_.rank());
    Tensor t = Tensor::full({3}, group_.rank(), DType::F32);
    sub->all_reduce(t).wait();
    double want = 0;
    for (int q = group_.rank() % 2; q < group_.size(); q += 2) want += q;
    record("split + all_reduce F32", count_wrong(t, [&](int64_t) { return want; }), t.numel());
  }

 private:
  ProcessGroup& group_;
  SelfCheckReport& report_;
};

double time_op(ProcessGroup& group, int iters, auto&& op) {
  op();  // warm-up
  group.barrier().wait();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) op();
  group.barrier().wait();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

// A pair of ranks to time, and what it stands for.
struct Pair {
  int a = -1, b = -1;
  std::string what;  // "same host h1" or "hosts h1 and h2"
};

// One pair of ranks on the same host and one on two hosts (when the job has
// them), by the ranks' host names.
std::vector<Pair> pairs_to_time(ProcessGroup& group) {
  const std::vector<std::string> hosts = all_gather_strings(group, host_name());
  std::vector<Pair> out;
  for (int a = 0; a < group.size() && out.empty(); ++a)
    for (int b = a + 1; b < group.size(); ++b)
      if (hosts[static_cast<size_t>(a)] == hosts[static_cast<size_t>(b)]) {
        out.push_back({a, b, format("same host {}", hosts[static_cast<size_t>(a)])});
        break;
      }
  for (int b = 1; b < group.size(); ++b)
    if (hosts[static_cast<size_t>(b)] != hosts[0]) {
      out.push_back({0, b, format("hosts {} and {}", hosts[0], hosts[static_cast<size_t>(b)])});
      break;
    }
  return out;
}

// Bandwidth between two ranks: an all_reduce on a group of just the pair
// (busbw = algbw for two ranks), while the other ranks wait.
void time_pairs(ProcessGroup& group, int64_t bytes, SelfCheckReport& report) {
  for (const Pair& pair : pairs_to_time(group)) {
    const bool member = group.rank() == pair.a || group.rank() == pair.b;
    std::unique_ptr<ProcessGroup> two = group.split(member ? 0 : -1, group.rank());
    double secs = 0;
    if (member) {
      Tensor t = Tensor::zeros({bytes / 4}, DType::F32);
      secs = time_op(*two, 5, [&] { two->all_reduce(t).wait(); });
    }
    Tensor s = Tensor::full({1}, secs, DType::F32);
    group.all_reduce(s, {.op = ReduceOp::Max}).wait();
    secs = s.data<float>()[0];
    const double b = static_cast<double>(bytes / 4 * 4);
    report.bandwidth.push_back(
        {format("ranks {} <-> {} ({})", pair.a, pair.b, pair.what), static_cast<int64_t>(b), secs, b / secs / 1e9});
  }
}

}  // namespace

bool SelfCheckReport::passed() const {
  return std::all_of(checks.begin(), checks.end(), [](const SelfCheckResult& c) { return c.wrong == 0; });
}

SelfCheckReport run_self_check(ProcessGroup& group, Logger& log, int64_t bandwidth_bytes) {
  SelfCheckReport report;
  Checker checker(group, report);
  for (DType dt : {DType::F32, DType::BF16, DType::I32}) checker.run_dtype(dt);
  checker.run_split();

  log.info0("collective self-check on {} rank(s), backend {}:", group.size(), group.backend_name());
  for (const SelfCheckResult& c : report.checks) {
    log.info0("  {:<28} {} wrong of {}", c.name, c.wrong, c.checked);
  }

  // One rank moves nothing over a wire, so a bandwidth figure would be noise.
  if (bandwidth_bytes > 0 && group.size() > 1) {
    const int p = group.size();
    const int64_t n = bandwidth_bytes / 4 / p * p;  // F32 elements, divisible by p
    Tensor full = Tensor::zeros({n}, DType::F32);
    Tensor shard = Tensor::zeros({n / p}, DType::F32);
    const int iters = 5;
    // nccl-tests: all_gather / reduce_scatter busbw = algbw * (p-1)/p, all_reduce = algbw * 2(p-1)/p.
    const double f = p > 1 ? static_cast<double>(p - 1) / p : 1.0;
    auto add = [&](std::string name, double secs, double factor) {
      double bytes = static_cast<double>(full.nbytes());
      report.bandwidth.push_back({std::move(name), static_cast<int64_t>(bytes), secs, bytes / secs * factor / 1e9});
    };
    add("all_gather F32", time_op(group, iters, [&] { group.all_gather(full, shard).wait(); }), f);
    add("reduce_scatter F32", time_op(group, iters, [&] { group.reduce_scatter(shard, full).wait(); }), f);
    add("all_reduce F32", time_op(group, iters, [&] { group.all_reduce(full).wait(); }), 2 * f);
    // Between two ranks: within a host and across hosts, when the job spans several.
    time_pairs(group, full.nbytes(), report);
    for (const BandwidthResult& b : report.bandwidth) {
      log.info0("  {:<34} {:>8.1f} MB {:>9.3f} ms  busbw {:>7.2f} GB/s", b.name, b.bytes / 1e6, b.seconds * 1e3,
                b.bus_gbps);
    }
  }
  return report;
}

}  // namespace st::launch
