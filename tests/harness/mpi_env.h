#pragma once
// Harness for the multi-rank GoogleTest binaries: tests/harness/mpi_main.cpp owns the
// CommRuntime and hands the tests its world group through these accessors.
// Every rank runs every test in the same order, so collectives in a test
// match up across ranks; use EXPECT_* (not ASSERT_*) around collectives, so a
// failing rank still joins the collectives the others are waiting in.
#include "core/comm.h"

namespace st::test {

/// The runtime main() created (MPI backend, at every world size).
CommRuntime& runtime();
/// Its world group.
inline ProcessGroup& world() { return runtime().world(); }

}  // namespace st::test
