#pragma once
// The CPU thread pool of a rank: OpenMP's, shared with oneDNN's GEMMs, so the
// model ops and the GEMMs never run two pools that fight for the same cores.
//
// Determinism: parallel_for cuts [0, n) into blocks whose bounds depend on n
// and the grain only, never on the thread count, and each block is computed
// by exactly one thread. A kernel that reduces across blocks adds the blocks'
// partial results in block order, so its result does not depend on how many
// threads ran it.
#include <algorithm>
#include <cstdint>
#include <string>

namespace st::cpu {

/// Threads the CPU ops of this process use (OpenMP's max threads).
int cpu_threads();
/// Sets the thread count of the CPU ops and GEMMs (>= 1).
void set_cpu_threads(int threads);
/// The cores this process may run on: its affinity mask, divided among the
/// `local_ranks` processes of the host when the mask is not narrower than the
/// host (ranks that the launcher did not bind would otherwise oversubscribe).
int auto_cpu_threads(int local_ranks);
/// Cores in this process's affinity mask, and online on the host.
int affinity_cores();
int host_cores();
/// Which library runs the GEMMs on these threads: "oneDNN <version> (<isa>)"
/// or "Eigen <version>" (for the trainer's and the benchmarks' logs; defined
/// beside the GEMM in gemm_cpu.cpp).
std::string gemm_backend();

/// OpenMP threads that wait for work spin before they sleep. libgomp's
/// default spin (300,000 rounds) is long enough that, on cores shared with
/// another job, the spinning threads steal the time the busy one needs
/// (llama-tiny at 2 threads beside two busy processes: 7.2 s instead of 2.1 s);
/// sleeping at once (OMP_WAIT_POLICY=passive) costs a futex wake-up per
/// parallel loop, ~600 loops per m8 step (m8 BF16 at 2 threads: 8,500 tok/s
/// against 9,800 with a short spin). So when neither OMP_WAIT_POLICY nor
/// GOMP_SPINCOUNT is set, a program sets GOMP_SPINCOUNT=2000 (a few
/// microseconds) with ST_SHORT_OPENMP_SPIN(), before libgomp reads it.
///
/// libgomp reads its environment once, in its initialiser, which runs right
/// after libc's. Only the executable's .preinit_array runs earlier, and there
/// setenv does not work: libc has not started (environ is still null) and its
/// initialiser then points environ back at the array the kernel passed. So
/// short_openmp_spin_preinit lends one entry of that array, in place, to
/// "GOMP_SPINCOUNT=2000": the first present of `_`, `OLDPWD`, `SHLVL`, `PWD`
/// (a shell's bookkeeping, which no library reads while it initialises).
/// short_openmp_spin_restore, a constructor of the executable (these run after
/// every shared library's initialiser, before main), puts the entry back and setenv's
/// GOMP_SPINCOUNT=2000, so main() sees the environment it was given plus that
/// setting. With none of those four set (`env -i`), libgomp keeps its default.
void short_openmp_spin_preinit(int argc, char** argv, char** envp);
void short_openmp_spin_restore();

namespace detail {
/// The two halves above on a given environment array (for tests): lends a
/// slot of `env` unless it sets OMP_WAIT_POLICY or GOMP_SPINCOUNT; returns
/// whether it did. return_spin_slot puts the lent entry back wherever `env`
/// holds the setting (it may be a copy that setenv made meanwhile).
bool lend_spin_slot(char** env);
void return_spin_slot(char** env);
}  // namespace detail

}  // namespace st::cpu

/// Sets GOMP_SPINCOUNT=2000 before libgomp starts (above), without
/// re-executing the program. Write it once at namespace scope in the file
/// that holds main(): .preinit_array entries count only in the executable's
/// own objects (a shared library may not have them, and an object of a
/// static library is linked only when something else pulls it in).
#define ST_SHORT_OPENMP_SPIN()                                                                                         \
  [[gnu::section(".preinit_array"), gnu::used]] static void (*const st_short_openmp_spin_lend_)(int, char**, char**) = \
      &::st::cpu::short_openmp_spin_preinit;                                                                           \
  [[gnu::constructor]] static void st_short_openmp_spin_return_() { ::st::cpu::short_openmp_spin_restore(); }          \
  static_assert(true)

namespace st::cpu {

namespace detail {
void run_blocks(int64_t blocks, void* ctx, void (*body)(void* ctx, int64_t block));
}

/// fn(begin, end) over consecutive blocks of `grain` indices of [0, n), spread
/// over cpu_threads() threads (serially inside another parallel region, or
/// when there is a single block).
template <class Fn>
void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t blocks = (n + grain - 1) / grain;
  if (blocks == 1) {
    fn(int64_t{0}, n);
    return;
  }
  struct Ctx {
    Fn* fn;
    int64_t n, grain;
  } ctx{&fn, n, grain};
  detail::run_blocks(blocks, &ctx, [](void* p, int64_t block) {
    auto* c = static_cast<Ctx*>(p);
    const int64_t begin = block * c->grain;
    (*c->fn)(begin, std::min(c->n, begin + c->grain));
  });
}

}  // namespace st::cpu
