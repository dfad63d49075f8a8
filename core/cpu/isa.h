#pragma once
// The CPU instruction-set level that the run-time choices of the CPU ops
// follow: oneDNN's kernels, the BF16 GEMM path and the AVX512_BF16 attention
// kernel. It is the machine's own level unless ST_MAX_CPU_ISA caps it, so
// that one machine can run (and CI can test) the paths of older CPUs:
//
//   ST_MAX_CPU_ISA=avx2 build/trainer ...     # as on an AVX2-only CPU
//
// The cap applies to choices made at run time only. Code that the compiler
// vectorised for -march=native keeps its vector width, which changes no
// result: the element helpers of vec.h round identically at every width.
#include <string>
#include <string_view>

namespace st::cpu {

/// Levels in increasing order; each implies the ones before it.
enum class CpuIsa {
  Avx2,        // AVX2 + FMA: the minimum shardtrain's CPU build runs on
  Avx512,      // AVX-512 F/BW/VL/DQ (oneDNN's avx512_core)
  Avx512Bf16,  // plus AVX512_BF16: BF16 dot products (vdpbf16ps)
  Amx,         // plus AMX tiles (BF16 and INT8)
};

/// The level this process's run-time choices follow: the machine's, capped by
/// ST_MAX_CPU_ISA when that is set. Throws naming the variable when its value
/// is not one of avx2, avx512, avx512_bf16, amx.
CpuIsa cpu_isa();
/// What the machine itself supports, ignoring the cap.
CpuIsa machine_cpu_isa();
/// "avx2", "avx512", "avx512_bf16" or "amx": the spelling ST_MAX_CPU_ISA takes.
std::string_view isa_name(CpuIsa isa);
/// For the start-up line: "avx2" or "avx2 (capped by ST_MAX_CPU_ISA; the machine has avx512_bf16)".
std::string isa_description();

/// The variable's name, for messages and docs.
inline constexpr const char* kMaxCpuIsaVariable = "ST_MAX_CPU_ISA";

namespace detail {
/// Parses an ST_MAX_CPU_ISA value (for tests); throws naming the variable.
CpuIsa parse_isa(std::string_view value);
}  // namespace detail

}  // namespace st::cpu
