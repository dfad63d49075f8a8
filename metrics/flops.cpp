// The GPU peak table and MFU.
#include "metrics/flops.h"

#include <array>
#include <string_view>

#include "core/error.h"

namespace st::metrics {

namespace {

// Dense tensor-core BF16 (FP32 accumulate) and plain FP32 peaks of one GPU,
// in FLOP/s, from NVIDIA's datasheets: "NVIDIA H100 Tensor Core GPU" (SXM,
// PCIe, NVL columns; BF16 there is quoted with 2:4 sparsity, halved here),
// "NVIDIA H200 Tensor Core GPU" (SXM, NVL), "NVIDIA A100 Tensor Core GPU",
// "NVIDIA L40S", and the "NVIDIA Ada GPU Architecture" whitepaper for the
// GeForce RTX 4090 (BF16 with FP32 accumulate, not the FP16-accumulate rate).
// Boost clocks; a card held at lower clocks by its power limit reaches less.
struct PeakEntry {
  std::string_view key;  // substring of cudaDeviceProp::name
  double bf16;
  double f32;
};
// First match wins, so a more specific key comes before the keys it contains
// ("H100 NVL" before "H100", "H200 NVL" before "H200"). GH200 matches "H200":
// its GPU has the H100 SXM rates.
constexpr std::array<PeakEntry, 10> kPeaks{{
    {"H100 NVL", 835e12, 60e12},
    {"H100 PCIe", 756e12, 51e12},
    {"H100 80GB HBM3", 989e12, 67e12},  // the SXM5 board's device name
    {"H100 SXM", 989e12, 67e12},
    {"H200 NVL", 835e12, 60e12},
    {"H200", 989e12, 67e12},
    {"A100", 312e12, 19.5e12},  // SXM4 and PCIe, 40 and 80 GB: the same rates
    {"L40S", 362e12, 91.6e12},
    {"RTX 4090", 165e12, 82.6e12},
    // Any other H100 name: the SXM rates, the usual board in training clusters.
    {"H100", 989e12, 67e12},
}};

}  // namespace

double peak_flops(const std::string& device_name, DType dtype) {
  for (const PeakEntry& e : kPeaks) {
    if (device_name.find(e.key) == std::string::npos) continue;
    switch (dtype) {
      case DType::BF16: return e.bf16;
      case DType::F32: return e.f32;
      case DType::I32: return 0;
    }
  }
  return 0;
}

double mfu(double tokens_per_s, double flops_per_token, double peak) {
  if (peak <= 0) return 0;
  return tokens_per_s * flops_per_token / peak;
}

}  // namespace st::metrics
