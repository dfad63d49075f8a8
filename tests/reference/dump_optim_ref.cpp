// Runs AdamW and SGD from st::optim for a few steps on deterministic data and
// writes every input and result as raw little-endian F32 (F64 for the LRs) into
// a directory, for tests/reference/torch_ref_optim.py to replay with torch.optim.
//
//   dump_optim_ref OUT_DIR
//
// One segment of kSegment elements holds three parameters with padding
// between and after them (NaN there, which must survive untouched):
//   w1 [0, 300) decay,  b1 [310, 330) no decay,  w2 [340, 940) decay,  tail [940, 1000).
// Inputs are written rather than regenerated in Python so that libm and
// numpy need not agree on sin/cos to the last bit.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "launch/config.h"
#include "optim/optimizer.h"

namespace {

using st::optim::ParamRange;
using st::optim::Segment;

constexpr int64_t kSegment = 1000;
constexpr int64_t kSteps = 10;
constexpr double kMaxNorm = 1.0;  // below the gradients' norm, so clipping acts

template <class T>
void write_bin(const std::string& dir, const std::string& name, const T* data, size_t n) {
  const std::string path = dir + "/" + name;
  std::ofstream out(path, std::ios::binary);
  ST_CHECK(out.good(), "cannot open {} for writing", path);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(T)));
  ST_CHECK(out.good(), "writing {} failed", path);
}

void write_tensor(const std::string& dir, const std::string& name, const st::Tensor& t) {
  write_bin(dir, name, t.data<float>(), static_cast<size_t>(t.numel()));
}

std::vector<ParamRange> ranges() { return {{"w1", 0, 300, true}, {"b1", 310, 20, false}, {"w2", 340, 600, true}}; }

// Padding holds NaN; parameters hold a smooth pattern.
st::Tensor initial_param() {
  std::vector<float> p(kSegment, std::numeric_limits<float>::quiet_NaN());
  for (const ParamRange& r : ranges())
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i) p[i] = static_cast<float>(0.5 * std::cos(0.11 * i));
  return st::Tensor::from_vector(p, {kSegment});
}

void fill_grad(const st::Tensor& grad, int64_t step) {
  float* g = grad.data<float>();
  for (int64_t i = 0; i < kSegment; ++i) g[i] = std::numeric_limits<float>::quiet_NaN();
  for (const ParamRange& r : ranges())
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i)
      g[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * static_cast<double>(step)));
}

// Runs `config` for kSteps with the schedule's LR; writes "<prefix>_*.bin".
void run(const std::string& dir, const std::string& prefix, const st::OptimConfig& config) {
  Segment segment{initial_param(), st::Tensor::zeros({kSegment}, st::DType::F32), ranges()};
  write_tensor(dir, prefix + "_param0.bin", segment.param);
  auto optimizer = st::optim::make_optimizer(config);
  optimizer->add_segment(segment);
  std::vector<double> lrs;
  for (int64_t step = 0; step < kSteps; ++step) {
    fill_grad(segment.grad, step + 1);
    write_tensor(dir, prefix + "_grad" + std::to_string(step + 1) + ".bin", segment.grad);
    lrs.push_back(st::optim::learning_rate(config, step, kSteps));
    optimizer->step(lrs.back());
  }
  write_bin(dir, prefix + "_lrs.bin", lrs.data(), lrs.size());
  write_tensor(dir, prefix + "_param.bin", segment.param);
  for (const auto& [name, tensor] : optimizer->state(0)) write_tensor(dir, prefix + "_" + name + ".bin", tensor);
}

// Global-norm clipping of the step-1 gradient: the clipped gradient and
// {norm, coefficient} as F64.
void run_clip(const std::string& dir) {
  Segment segment{initial_param(), st::Tensor::zeros({kSegment}, st::DType::F32), ranges()};
  fill_grad(segment.grad, 1);
  const double norm = std::sqrt(st::optim::grad_sum_of_squares(segment));
  const double coef = st::optim::clip_coefficient(norm, kMaxNorm);
  st::optim::scale_grad(segment, coef);
  const double stats[2] = {norm, coef};
  write_bin(dir, "clip_stats.bin", stats, 2);
  write_tensor(dir, "clip_grad.bin", segment.grad);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    ST_CHECK(argc == 2, "usage: dump_optim_ref OUT_DIR");
    const std::string dir = argv[1];

    st::OptimConfig adamw;
    adamw.name = st::OptimizerKind::AdamW;
    adamw.lr = 1e-2;
    adamw.weight_decay = 0.1;
    adamw.beta1 = 0.9;
    adamw.beta2 = 0.95;
    adamw.eps = 1e-8;
    adamw.schedule = {st::ScheduleKind::Cosine, 3, 1e-3};
    run(dir, "adamw", adamw);

    st::OptimConfig sgd;
    sgd.name = st::OptimizerKind::Sgd;
    sgd.lr = 5e-2;
    sgd.weight_decay = 0.1;
    sgd.momentum = 0.9;
    sgd.schedule = {st::ScheduleKind::Linear, 2, 5e-3};
    run(dir, "sgd", sgd);

    run_clip(dir);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "dump_optim_ref: " << e.what() << "\n";
    return 1;
  }
}
