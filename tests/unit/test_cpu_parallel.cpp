// core/cpu/parallel.h: the environment entry lent to GOMP_SPINCOUNT=2000
// while libgomp starts (ST_SHORT_OPENMP_SPIN), on environment arrays built
// here. tests/e2e/check_startup.py checks the programs themselves (libgomp's
// own report of the spin count, and that each starts once).
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/cpu/parallel.h"

namespace st {
namespace {

// A NULL-terminated environment array over `entries`, as the kernel passes one.
struct Env {
  explicit Env(std::vector<std::string> entries) : text(std::move(entries)) {
    for (std::string& e : text) ptrs.push_back(e.data());
    ptrs.push_back(nullptr);
  }
  std::vector<std::string> text;
  std::vector<char*> ptrs;
};

TEST(ShortOpenmpSpin, LendsTheShellsUnderscoreFirstAndReturnsIt) {
  Env env({"HOME=/root", "PWD=/work", "_=/usr/bin/trainer", "SHLVL=1"});
  char* const underscore = env.ptrs[2];
  ASSERT_TRUE(cpu::detail::lend_spin_slot(env.ptrs.data()));
  EXPECT_EQ(std::string(env.ptrs[2]), "GOMP_SPINCOUNT=2000");
  EXPECT_EQ(std::string(env.ptrs[1]), "PWD=/work");
  EXPECT_EQ(std::string(env.ptrs[3]), "SHLVL=1");
  cpu::detail::return_spin_slot(env.ptrs.data());
  EXPECT_EQ(env.ptrs[2], underscore);
}

TEST(ShortOpenmpSpin, ReturnsTheEntryIntoACopyOfTheArray) {
  // setenv during start-up copies the array: the lent entry goes back into the copy.
  Env env({"PWDX=1", "PWD=/work"});
  char* const pwd = env.ptrs[1];
  ASSERT_TRUE(cpu::detail::lend_spin_slot(env.ptrs.data()));
  EXPECT_EQ(std::string(env.ptrs[0]), "PWDX=1");
  std::vector<char*> copy = {env.ptrs[1], env.ptrs[0], nullptr};
  cpu::detail::return_spin_slot(copy.data());
  EXPECT_EQ(copy[0], pwd);
}

TEST(ShortOpenmpSpin, LeavesTheUsersSettingsAndBareEnvironmentsAlone) {
  for (const char* user : {"GOMP_SPINCOUNT=5", "OMP_WAIT_POLICY=passive"}) {
    Env env({"PWD=/work", user});
    EXPECT_FALSE(cpu::detail::lend_spin_slot(env.ptrs.data())) << user;
    EXPECT_EQ(std::string(env.ptrs[0]), "PWD=/work") << user;
  }
  Env bare({"HOME=/root", "PATH=/usr/bin"});
  EXPECT_FALSE(cpu::detail::lend_spin_slot(bare.ptrs.data()));
  EXPECT_EQ(std::string(bare.ptrs[0]), "HOME=/root");
  EXPECT_EQ(std::string(bare.ptrs[1]), "PATH=/usr/bin");
}

}  // namespace
}  // namespace st
