// gemm_peak: the large-GEMM throughput of this machine through our own
// st::ops::gemm (oneDNN when built with it, else Eigen), the denominator of
// "fraction of peak" in bench/cpu_bench.sh.
//
//   build/gemm_peak --threads 2                 # 2048^3, F32 and BF16
//   build/gemm_peak --size 4096 --repeats 10
//   build/gemm_peak --device cuda --size 8192 --dtypes bf16   # GPU 0 (cuBLASLt)
//
// For each operand dtype (F32, BF16; the output C is always F32, so BF16 runs
// multiply BF16 operands with F32 accumulation) and each layout the trainer
// uses for a Linear (NN: dx = dy @ W; NT: y = x @ W^T), it times --repeats
// calls of c = a @ op(b) after --warmup untimed ones (which also build and
// cache oneDNN's primitive) and prints one JSON line per dtype:
//   {"impl":"shardtrain","dtype":"bf16","size":2048,"threads":2,
//    "gflops":..., "gflops_max":..., "layouts":{"nn":...,"nt":...}, ...}
// gflops is the best layout's median (2*M*N*K / median seconds / 1e9);
// gflops_max is the fastest single call seen. One process, no MPI.
// With --device cuda the operands live on GPU 0, C has the operands' dtype
// (what a BF16 Linear writes: BF16 x BF16 with F32 accumulation, rounded to
// BF16), and each call is timed up to the end of its work on the GPU.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/cli.h"
#include "core/cpu/parallel.h"
#include "core/cuda/cuda_runtime.h"
#include "core/error.h"
#include "core/format.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace st::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  int64_t size = 2048;  // M = N = K
  int threads = 0;      // 0: the cores of this process's affinity mask
  int warmup = 2;
  int repeats = 8;
  std::vector<DType> dtypes{DType::F32, DType::BF16};
  Device device = Device::cpu();
};

std::vector<DType> parse_dtypes(const std::string& list) {
  std::vector<DType> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string name = list.substr(start, comma - start);
    ST_USAGE_CHECK(name == "f32" || name == "bf16", "--dtypes: unknown dtype '{}' (f32, bf16)", name);
    out.push_back(name == "f32" ? DType::F32 : DType::BF16);
    start = comma + 1;
  }
  return out;
}

/// The flags, writing into `a`.
cli::Parser args_parser(Args& a) {
  constexpr int kMaxInt = std::numeric_limits<int>::max();
  auto device = [&a](const std::string& name) {
    ST_USAGE_CHECK(name == "cpu" || name == "cuda", "--device: expected cpu or cuda, got '{}'", name);
    a.device = name == "cpu" ? Device::cpu() : Device::cuda(0);
  };
  cli::Parser p("gemm_peak", "gemm_peak [--size N] [--threads N] [--warmup N] [--repeats N] [--dtypes f32,bf16]");
  p.option("--size", "N", &a.size, "M = N = K of the GEMM (default 2048)", 1)
      .option("--threads", "N", &a.threads, "OpenMP/oneDNN threads (default 0: the cores this process may use)", 0,
              kMaxInt)
      .option("--warmup", "N", &a.warmup, "untimed calls per dtype and layout first (default 2)", 0, kMaxInt)
      .option("--repeats", "N", &a.repeats, "timed calls per dtype and layout; the median is reported (default 8)", 1,
              kMaxInt)
      .option(
          "--dtypes", "L", [&a](const std::string& list) { a.dtypes = parse_dtypes(list); },
          "operand dtypes, comma-separated from f32 and bf16 (default both); C is F32 on the CPU")
      .option("--device", "D", device, "cpu (default) or cuda (GPU 0 through cuBLASLt; C in the operands' dtype)");
  return p;
}

// Uniform values in [-1, 1): no denormals, no overflow, nothing a library
// could special-case (zeros or constants might be).
Tensor random_matrix(int64_t rows, int64_t cols, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (float& v : values) v = dist(rng);
  return Tensor::from_floats(values, {rows, cols}, dtype);
}

// Returns once every GEMM issued so far has finished (a no-op on the CPU,
// where gemm returns with its result in place).
void finish(Device device) {
  if (device.is_cuda()) cuda::synchronize(device.index);
}

struct Timing {
  double median_s = 0;
  double min_s = 0;
};

// Times c = a @ op(b): `warmup` calls first, then `repeats` timed calls.
Timing time_gemm(const Tensor& a, const Tensor& b, ops::Transpose tb, const Tensor& c, const Args& args) {
  for (int i = 0; i < args.warmup; ++i) ops::gemm(a, ops::Transpose::No, b, tb, c);
  finish(args.device);
  std::vector<double> seconds;
  for (int i = 0; i < args.repeats; ++i) {
    const auto t0 = Clock::now();
    ops::gemm(a, ops::Transpose::No, b, tb, c);
    finish(args.device);
    seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  // The median of an even count is the mean of the middle two.
  const size_t n = seconds.size();
  return {n % 2 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]), seconds.front()};
}

// One JSON line for `dtype`: both layouts, the best one's median as "gflops".
std::string measure(DType dtype, const Args& args) {
  const int64_t n = args.size;
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  const Tensor a = random_matrix(n, n, dtype, 1).to(args.device);  // [M, K]
  const Tensor b = random_matrix(n, n, dtype, 2).to(args.device);  // [K, N] (NN) or [N, K] (NT)
  const Tensor c = Tensor::empty({n, n}, args.device.is_cuda() ? dtype : DType::F32, args.device);
  const Timing nn = time_gemm(a, b, ops::Transpose::No, c, args);
  const Timing nt = time_gemm(a, b, ops::Transpose::Yes, c, args);
  const double best_median = std::min(nn.median_s, nt.median_s);
  const double best_single = std::min(nn.min_s, nt.min_s);
  const std::string name = dtype == DType::F32 ? "f32" : "bf16";
  const std::string backend = args.device.is_cuda() ? "cublaslt" : cpu::gemm_backend();
  return format(R"({{"impl":"shardtrain","dtype":"{}","size":{},"threads":{},"gflops":{:.2f},"gflops_max":{:.2f},)"
                R"("layouts":{{"nn":{:.2f},"nt":{:.2f}}},"repeats":{},"warmup":{},"backend":"{}","device":"{}"}})",
                name, n, cpu::cpu_threads(), flops / best_median / 1e9, flops / best_single / 1e9,
                flops / nn.median_s / 1e9, flops / nt.median_s / 1e9, args.repeats, args.warmup, backend,
                args.device.is_cuda() ? cuda::device_name(args.device.index) : std::string("cpu"));
}

int run(const std::vector<std::string>& argv) {
  Args args;
  const cli::Parser parser = args_parser(args);
  if (parser.parse_or_help(argv)) return 0;
  cpu::set_cpu_threads(args.threads > 0 ? args.threads : cpu::auto_cpu_threads(1));
  if (args.device.is_cuda()) {
    ST_CHECK(cuda::compiled_with_cuda(), "--device cuda: this build has no CUDA backend (ST_WITH_CUDA=OFF)");
    ST_CHECK(cuda::device_count() > 0, "--device cuda: no GPU is visible");
    cuda::set_device(args.device.index);
  }
  for (DType dtype : args.dtypes) {
    std::printf("%s\n", measure(dtype, args).c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace st::bench

// OpenMP threads spin only briefly while they wait, as in the trainer (core/cpu/parallel.h).
ST_SHORT_OPENMP_SPIN();

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return st::run_main("gemm_peak", [&] { return st::bench::run(args); });
}
