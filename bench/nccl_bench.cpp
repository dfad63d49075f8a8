// nccl_bench: bandwidth of shardtrain's NCCL ProcessGroup (core/comm_nccl.cpp)
// for the two collectives FSDP lives on, all_gather and reduce_scatter, in
// BF16 and F32, over message sizes from --min-bytes to --max-bytes in x4 steps.
//
//   mpirun -np 8 build/nccl_bench [--min-bytes 1024] [--max-bytes 1073741824] [--warmup 5] [--iters 20]
//
// One GPU per rank: rank -> cuda:(local rank % GPUs on the host). Sizes and
// bandwidths follow nccl-tests: `size` is the whole gathered buffer (all_gather
// output, reduce_scatter input), algbw = size / time, and busbw = algbw *
// (n-1)/n for both collectives, the bytes each rank's link must carry
// whatever the algorithm. At one rank nothing crosses a link, so busbw is 0 by
// definition and only algbw (a device-local copy or reduction) is printed.
// Time per call is measured with CUDA events on the compute stream around
// `iters` back-to-back calls (each call waited, so they run one after
// another), and the slowest rank's time is reported. BF16 reduce_scatter
// includes the upcast to F32 and the single rounding after the sum, which the
// exactness contract of core/comm.h requires.
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "core/cli.h"
#include "core/comm.h"
#include "core/cuda/cuda_runtime.h"
#include "core/cuda/stream.h"

namespace st {
namespace {

struct Options {
  int64_t min_bytes = int64_t{1} << 10;
  int64_t max_bytes = int64_t{1} << 30;
  int warmup = 5;
  int iters = 20;
};

/// The flags, writing into `o`.
cli::Parser options_parser(Options& o) {
  constexpr int kMaxInt = std::numeric_limits<int>::max();
  cli::Parser p("nccl_bench", "nccl_bench [--min-bytes B] [--max-bytes B] [--warmup N] [--iters N]");
  p.text(
       "all_gather and reduce_scatter of the NCCL ProcessGroup, BF16 and F32, sizes min..max in x4 steps.\n"
       "Run under mpirun with one GPU per rank.\n")
      .option("--min-bytes", "B", &o.min_bytes, "the smallest size (default 1024)", 1)
      .option("--max-bytes", "B", &o.max_bytes, "the largest size (default 1073741824)", 1)
      .option("--warmup", "N", &o.warmup, "untimed calls per size first (default 5)", 0, kMaxInt)
      .option("--iters", "N", &o.iters, "timed calls per size (default 20)", 1, kMaxInt);
  return p;
}

enum class Collective : uint8_t { AllGather, ReduceScatter };

const char* name_of(Collective c) { return c == Collective::AllGather ? "all_gather" : "reduce_scatter"; }

/// "1 KiB", "256 MiB".
std::string bytes_str(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof(text), v == static_cast<double>(static_cast<int64_t>(v)) ? "%.0f %s" : "%.2f %s", v,
                units[u]);
  return text;
}

/// Times one (collective, dtype) over every size and prints its rows on rank 0.
void run_series(ProcessGroup& world, ProcessGroup& nccl, int device, Collective c, DType dtype, const Options& o) {
  const int n = nccl.size();
  const auto width = static_cast<int64_t>(dtype_size(dtype));
  // The largest buffers, allocated once; each size runs on views of them.
  const int64_t max_count = o.max_bytes / width / n * n;
  if (max_count == 0) return;
  const Device gpu = Device::cuda(device);
  Tensor whole = Tensor::full({max_count}, 1.0, dtype, gpu);      // gathered output / scattered input
  Tensor piece = Tensor::full({max_count / n}, 1.0, dtype, gpu);  // one rank's input / output
  cudaStream_t compute = cuda::compute_stream(device);
  cuda::Event start(cuda::Event::Timing::On);
  cuda::Event stop(cuda::Event::Timing::On);

  for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
    const int64_t count = bytes / width / n * n;  // whole elements, divisible by the rank count
    if (count == 0) continue;
    Tensor big = whole.flat_slice(0, count);
    Tensor small = piece.flat_slice(0, count / n);
    auto call = [&] {
      if (c == Collective::AllGather) {
        nccl.all_gather(big, small).wait();
      } else {
        nccl.reduce_scatter(small, big).wait();
      }
    };
    for (int i = 0; i < o.warmup; ++i) call();
    start.record(compute);
    for (int i = 0; i < o.iters; ++i) call();
    stop.record(compute);
    stop.synchronize();
    // The slowest rank sets the pace of a collective.
    Tensor ms = Tensor::full({1}, cuda::Event::elapsed_ms(start, stop) / o.iters, DType::F32);
    world.all_reduce(ms, {.op = ReduceOp::Max}).wait();
    const double seconds = ms.data<float>()[0] * 1e-3;
    const double size_bytes = static_cast<double>(count * width);
    const double algbw = size_bytes / seconds / 1e9;
    if (world.rank() != 0) continue;
    if (n > 1) {
      const double busbw = algbw * (n - 1) / n;
      std::printf("%-15s %-5s %12s %12lld %12.1f %12.2f %12.2f\n", name_of(c), std::string(dtype_name(dtype)).c_str(),
                  bytes_str(count * width).c_str(), static_cast<long long>(count), seconds * 1e6, algbw, busbw);
    } else {
      std::printf("%-15s %-5s %12s %12lld %12.1f %12.2f\n", name_of(c), std::string(dtype_name(dtype)).c_str(),
                  bytes_str(count * width).c_str(), static_cast<long long>(count), seconds * 1e6, algbw);
    }
    std::fflush(stdout);
  }
}

int run(const std::vector<std::string>& argv) {
  Options o;
  const cli::Parser parser = options_parser(o);
  if (parser.parse_or_help(argv)) return 0;
  ST_USAGE_CHECK(o.min_bytes <= o.max_bytes, "--min-bytes {} is larger than --max-bytes {}", o.min_bytes, o.max_bytes);
  CommRuntime runtime;
  ProcessGroup& world = runtime.world();
  const WorldInfo& info = runtime.info();
  const int gpus = cuda::device_count();
  ST_CHECK(gpus > 0, "nccl_bench needs a CUDA GPU, and none is visible on rank {} (no device or no driver)",
           world.rank());
  ST_CHECK(nccl_available(), "nccl_bench needs the NCCL backend; this build has none (configure with -DST_NCCL_ROOT)");
  ST_CHECK(info.local_size <= gpus,
           "{} ranks run on this host but it has {} GPU(s); NCCL needs one GPU per rank (start at most {} per host)",
           info.local_size, gpus, gpus);
  const int device = info.local_rank % gpus;
  cuda::set_device(device);
  std::unique_ptr<ProcessGroup> nccl = make_nccl_group(world, device);
  const int n = nccl->size();

  if (world.rank() == 0) {
    std::printf("nccl_bench: %d rank(s), %s (rank 0), %d warm-up + %d timed calls per size\n", n,
                cuda::device_name(device).c_str(), o.warmup, o.iters);
    std::printf("size = whole gathered buffer; algbw = size / time; busbw = algbw * (n-1)/n (nccl-tests)\n");
    if (n == 1) {
      std::printf("world size 1: bus bandwidth is 0 by definition (nothing crosses a link); algbw only\n");
      std::printf("%-15s %-5s %12s %12s %12s %12s\n", "collective", "dtype", "size", "count", "time(us)",
                  "algbw(GB/s)");
    } else {
      std::printf("%-15s %-5s %12s %12s %12s %12s %12s\n", "collective", "dtype", "size", "count", "time(us)",
                  "algbw(GB/s)", "busbw(GB/s)");
    }
  }
  for (Collective c : {Collective::AllGather, Collective::ReduceScatter}) {
    for (DType dtype : {DType::BF16, DType::F32}) run_series(world, *nccl, device, c, dtype, o);
  }
  return 0;
}

}  // namespace
}  // namespace st

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  return st::run_main("nccl_bench", [&] { return st::run(args); });
}
