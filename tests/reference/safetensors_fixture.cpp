// Cross-language fixture for tests/reference/safetensors_check.py.
//
//   safetensors_fixture write PATH    writes the known tensors below
//   safetensors_fixture verify PATH   reads PATH (e.g. written by Python) and
//                                     checks it holds exactly those tensors
//
// Values come from integer formulas and single correctly-rounded operations
// (division, F32 -> BF16 round-to-nearest-even) so numpy reproduces every bit
// without depending on either side's libm.
#include <bit>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/tensor.h"

namespace {

using st::DType;
using st::Tensor;

int64_t k_of(int64_t i) { return (i * 7919) % 10007 - 5003; }

struct Expected {
  std::string name;
  Tensor tensor;
};

std::vector<Expected> expected_tensors() {
  std::vector<float> weight(15);
  for (size_t i = 0; i < weight.size(); ++i)
    weight[i] = static_cast<float>(static_cast<double>(k_of(static_cast<int64_t>(i))) / 3.0);
  std::vector<st::BFloat16> bias(37);
  for (size_t i = 0; i < bias.size(); ++i)
    bias[i] = st::BFloat16(static_cast<float>(static_cast<double>(k_of(static_cast<int64_t>(i))) / 7.0));
  // Exact ties (low half 0x8000): round-to-nearest-even must pick the even upper half.
  std::vector<st::BFloat16> ties(8);
  for (uint32_t i = 0; i < ties.size(); ++i)
    ties[i] = st::BFloat16(std::bit_cast<float>(((0x3F80u + i) << 16) | 0x8000u));
  std::vector<int32_t> ids(24);
  for (uint32_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i * 2654435761u);
  return {{"layers.0.weight", Tensor::from_vector(weight, {3, 5})},
          {"layers.0.bias", Tensor::from_vector(bias, {37})},
          {"ties", Tensor::from_vector(ties, {2, 4})},
          {"ids", Tensor::from_vector(ids, {4, 6})},
          {"scalar", Tensor::from_vector<float>({3.25f}, {})},
          {"empty", Tensor::zeros({0}, DType::I32)}};
}

int write_file(const std::string& path) {
  st::checkpoint::SafetensorsWriter w;
  w.set_metadata("format", "pt");
  w.set_metadata("producer", "safetensors_fixture");
  for (const Expected& e : expected_tensors()) w.add(e.name, e.tensor);
  w.write(path);
  return 0;
}

int verify_file(const std::string& path) {
  const st::checkpoint::SafetensorsFile f(path);
  int failures = 0;
  auto fail = [&](const std::string& what) {
    std::cerr << "safetensors_fixture: " << path << ": " << what << "\n";
    ++failures;
  };
  const auto want = expected_tensors();
  if (f.names().size() != want.size()) fail(st::format("{} tensors, expected {}", f.names().size(), want.size()));
  for (const Expected& e : want) {
    if (!f.has(e.name)) {
      fail(st::format("tensor '{}' is missing", e.name));
      continue;
    }
    const Tensor got = f.read_tensor(e.name);
    if (got.dtype() != e.tensor.dtype() || got.shape() != e.tensor.shape()) {
      fail(st::format("tensor '{}' is {} {}, expected {} {}", e.name, got.dtype(), st::shape_str(got.shape()),
                      e.tensor.dtype(), st::shape_str(e.tensor.shape())));
      continue;
    }
    const auto* g = static_cast<const unsigned char*>(got.raw_data());
    const auto* x = static_cast<const unsigned char*>(e.tensor.raw_data());
    for (size_t b = 0; b < got.nbytes(); ++b) {
      if (g[b] != x[b]) {
        fail(st::format("tensor '{}' differs first at byte {}", e.name, b));
        break;
      }
    }
  }
  if (f.metadata().count("producer") == 0 || f.metadata().at("producer") != "safetensors_check.py")
    fail("__metadata__ lacks producer=safetensors_check.py");
  if (failures == 0) std::cout << "safetensors_fixture: " << path << ": " << want.size() << " tensors match\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "write" && mode != "verify") {
    std::cerr << "usage: safetensors_fixture write|verify PATH\n";
    return 2;
  }
  try {
    return mode == "write" ? write_file(argv[2]) : verify_file(argv[2]);
  } catch (const st::Error& e) {
    std::cerr << "error: " << e.message() << "\n";
    return 1;
  }
}
