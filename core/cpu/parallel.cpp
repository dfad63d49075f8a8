#include "core/cpu/parallel.h"

#include <cstdlib>
#include <string_view>

#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/error.h"

namespace st::cpu {

int cpu_threads() { return omp_get_max_threads(); }

void set_cpu_threads(int threads) {
  ST_CHECK(threads >= 1, "set_cpu_threads: {} threads; need at least 1", threads);
  omp_set_num_threads(threads);
}

int affinity_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return host_cores();
  return std::max(1, CPU_COUNT(&set));
}

int host_cores() {
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

int auto_cpu_threads(int local_ranks) {
  const int mine = affinity_cores();
  // A mask narrower than the host was set by the launcher (--bind-to core,
  // taskset, a cgroup cpuset): it is this rank's alone. Otherwise every rank
  // on the host sees every core, and each takes its share.
  if (mine < host_cores() || local_ranks <= 1) return mine;
  return std::max(1, mine / local_ranks);
}

namespace {

constexpr char kSpinSetting[] = "GOMP_SPINCOUNT=2000";
// Entries whose absence for the few microseconds of library start-up nobody notices.
constexpr std::string_view kLendable[] = {"_=", "OLDPWD=", "SHLVL=", "PWD="};

// What short_openmp_spin_preinit lent, until short_openmp_spin_restore returns
// it. Written once before main() runs, by the loader's single thread.
char* lent_entry = nullptr;

bool sets(char** env, std::string_view prefix) {
  for (char** e = env; *e != nullptr; ++e)
    if (std::string_view(*e).starts_with(prefix)) return true;
  return false;
}

}  // namespace

namespace detail {

bool lend_spin_slot(char** env) {
  if (env == nullptr || sets(env, "OMP_WAIT_POLICY=") || sets(env, "GOMP_SPINCOUNT=")) return false;
  for (std::string_view name : kLendable) {
    for (char** e = env; *e != nullptr; ++e) {
      if (!std::string_view(*e).starts_with(name)) continue;
      lent_entry = *e;
      *e = const_cast<char*>(kSpinSetting);  // read only, by getenv, until it is returned
      return true;
    }
  }
  return false;
}

void return_spin_slot(char** env) {
  if (lent_entry == nullptr || env == nullptr) return;
  for (char** e = env; *e != nullptr; ++e) {
    if (*e == kSpinSetting) {
      *e = lent_entry;
      break;
    }
  }
  lent_entry = nullptr;
}

}  // namespace detail

void short_openmp_spin_preinit(int /*argc*/, char** /*argv*/, char** envp) { (void)detail::lend_spin_slot(envp); }

void short_openmp_spin_restore() {
  if (lent_entry == nullptr) return;
  detail::return_spin_slot(environ);
  // A short spin catches the next parallel loop of a busy step without a
  // futex wake-up, and gives a shared core back within microseconds; kept in
  // the environment so that what main() and child processes see matches.
  setenv("GOMP_SPINCOUNT", "2000", 1);
}

namespace detail {

namespace {

// ThreadSanitizer sees neither the fork nor the join of an OpenMP region:
// libgomp is not instrumented and its pooled threads wait on futexes, so a
// block that a pooled thread runs looked to TSan as if it raced with what the
// calling thread wrote before the region and freed after it (test_nn_ops:
// "data race" between a tensor's delete and a swiglu_backward block). The two
// barriers are stated to it as release/acquire pairs; without TSan these are
// empty. The block of arguments the compiler writes for the region just
// before it starts (after any statement of ours) cannot be covered so, so
// run_blocks' own loads and stores, which touch nothing but that block and its
// locals, are not instrumented (ST_NO_TSAN); the bodies it calls are.
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
void happens_before(void* sync) { __tsan_release(sync); }
void happens_after(void* sync) { __tsan_acquire(sync); }
#define ST_NO_TSAN __attribute__((no_sanitize_thread))
#else
void happens_before(void*) {}
void happens_after(void*) {}
#define ST_NO_TSAN
#endif

}  // namespace

ST_NO_TSAN void run_blocks(int64_t blocks, void* ctx, void (*body)(void* ctx, int64_t block)) {
  if (omp_in_parallel() || omp_get_max_threads() == 1) {
    for (int64_t b = 0; b < blocks; ++b) body(ctx, b);
    return;
  }
  char fork_sync = 0, join_sync = 0;  // their addresses name the barriers for TSan
  happens_before(&fork_sync);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    happens_after(&fork_sync);
    body(ctx, b);
    happens_before(&join_sync);
  }
  happens_after(&join_sync);
}

}  // namespace detail

}  // namespace st::cpu
