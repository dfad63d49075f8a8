#pragma once
// Test hooks: points in the program where a fault test can stop a process
// exactly, instead of guessing the moment from the wall clock (which a busy
// machine moves). Production runs never set the variable; the check costs
// one comparison.
//
//   ST_TEST_PAUSE_AT=marker_written@3 trainer ...   # stop in step 3's commit, after the marker
//
// A process reaching point P (of step S when "@S" is given) prints
//   test hook: paused at P of step S (pid N)
// to stderr and waits there until it is killed, so that the test, having
// read that line, kills it at exactly that point. Only the calling thread
// waits: a rank's other threads (an async save, the watchdog) go on.
#include <cstdint>
#include <string_view>

namespace st {

/// Pauses here when ST_TEST_PAUSE_AT names `point` (and `step`, if it names one).
void test_pause_point(std::string_view point, int64_t step);

}  // namespace st
