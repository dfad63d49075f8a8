#include "core/cpu/isa.h"

#include <cstdlib>

#include "core/error.h"
#include "core/format.h"

namespace st::cpu {

namespace {

CpuIsa detect() {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (!avx512) return CpuIsa::Avx2;
  if (!__builtin_cpu_supports("avx512bf16")) return CpuIsa::Avx512;
  // GCC 12's __builtin_cpu_supports has no AMX feature names; CPUID leaf 7
  // reports AMX-BF16 in EDX bit 22 and AMX-TILE in bit 24.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(0));
  const bool amx = (edx >> 22 & 1u) != 0 && (edx >> 24 & 1u) != 0;
  return amx ? CpuIsa::Amx : CpuIsa::Avx512Bf16;
}

struct Levels {
  CpuIsa machine;
  CpuIsa effective;
  bool capped;
};

const Levels& levels() {
  static const Levels l = [] {
    Levels out{detect(), CpuIsa::Avx2, false};
    out.effective = out.machine;
    if (const char* cap = std::getenv(kMaxCpuIsaVariable); cap != nullptr && *cap != '\0') {
      const CpuIsa limit = detail::parse_isa(cap);
      if (limit < out.machine) {
        out.effective = limit;
        out.capped = true;
      }
    }
    return out;
  }();
  return l;
}

}  // namespace

namespace detail {

CpuIsa parse_isa(std::string_view value) {
  for (CpuIsa isa : {CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16, CpuIsa::Amx}) {
    if (value == isa_name(isa)) return isa;
  }
  ST_FAIL("{}={} is not an instruction-set level: expected avx2, avx512, avx512_bf16 or amx", kMaxCpuIsaVariable,
          value);
}

}  // namespace detail

CpuIsa cpu_isa() { return levels().effective; }

CpuIsa machine_cpu_isa() { return levels().machine; }

std::string_view isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Avx512Bf16: return "avx512_bf16";
    case CpuIsa::Amx: return "amx";
  }
  return "?";
}

std::string isa_description() {
  const Levels& l = levels();
  if (!l.capped) return std::string(isa_name(l.effective));
  return format("{} (capped by {}; the machine has {})", isa_name(l.effective), kMaxCpuIsaVariable,
                isa_name(l.machine));
}

}  // namespace st::cpu
