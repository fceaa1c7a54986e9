// Polls `done` every 10 ms until it holds or `limit` passes: for a test that
// waits on another thread's progress. True when it held.
#pragma once

#include <chrono>
#include <thread>

namespace fedwan::testing {

template <typename Done>
bool wait_for(Done done, std::chrono::steady_clock::duration limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace fedwan::testing
