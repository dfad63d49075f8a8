#pragma once
// Private to optim/: the pieces the optimizer .cpp files share.
//
// Rounding rule for every element-wise kernel here: F32 arithmetic that
// rounds exactly as torch 1.13's CPU kernels do on an AVX2 build. Where
// torch's vectorised add/addcmul computes fmadd(b, alpha, a) the kernels call
// std::fma; every other product is rounded on its own. GCC contracts a*b + c
// into an FMA even across statements in C++ (also with -std=c++20), which
// would silently change results, so ST_OPTIM_KERNEL turns contraction off for
// the kernel; clang contracts only within one expression, so kernels keep
// such products in separate statements. On x86-64 the kernel is compiled
// twice (with and without the FMA instruction set) and the loader picks one:
// both round identically, the FMA one just runs without a libm call per fma.
// Not under ThreadSanitizer: it instruments the clones' ifunc resolver, which
// the loader runs before TSan's runtime exists (test_optim died with SIGSEGV
// in sgd_kernel's resolver before main), so there the kernel is compiled once.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "optim/config.h"
#include "optim/optimizer.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define ST_OPTIM_KERNEL [[gnu::target_clones("fma", "default"), gnu::optimize("fp-contract=off")]]
#elif defined(__GNUC__) && !defined(__clang__)
#define ST_OPTIM_KERNEL [[gnu::optimize("fp-contract=off")]]
#else
#define ST_OPTIM_KERNEL
#endif

namespace st::optim::detail {

/// "segment holding 'a' .. 'z' (3 parameters)", for error messages.
std::string segment_name(const Segment& segment);
/// Throws st::Error naming the parameter unless `segment` is usable: param and
/// grad F32, 1-D, on one device, same numel; ranges sorted, disjoint, in
/// bounds; on a GPU, device_ranges present with one row per range.
void validate_segment(const Segment& segment);
/// Throws unless `lr` is finite and >= 0.
void validate_lr(double lr);

/// [begin, end) of a segment: one piece of one parameter range.
struct RangeBlock {
  int64_t begin = 0, end = 0;
  bool weight_decay = false;
};
/// The ranges of `segment` cut into pieces of at most `block` elements, in
/// segment order. One parallel loop over them covers the whole segment (one
/// thread wake-up per segment instead of one per parameter), and the cuts
/// depend on the ranges alone, never on the thread count.
std::vector<RangeBlock> range_blocks(const Segment& segment, int64_t block);

std::unique_ptr<Optimizer> make_adamw(const OptimConfig& config);
std::unique_ptr<Optimizer> make_sgd(const OptimConfig& config);

}  // namespace st::optim::detail
