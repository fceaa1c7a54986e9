// The ranks of one site as threads of a test: their communicator options
// (a rendezvous directory under a TempDir) and a runner that collects each
// rank's failure instead of letting it escape its thread.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "fedwan/site_comm.hpp"
#include "harness/node_spawner.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan::testing {

// Rank `rank` of `size` of the site `name`, meeting in <dir>/rdv-<name>.
inline SiteCommOptions rank_options(const TempDir& dir, int rank, int size,
                                    std::chrono::milliseconds timeout,
                                    const std::string& name = "site-a") {
  SiteCommOptions o;
  o.rank = rank;
  o.size = size;
  o.rendezvous_dir = (dir.path() / ("rdv-" + name)).string();
  o.name = name;
  o.timeout = timeout;
  return o;
}

// Runs `body(rank)` on `size` threads; returns each rank's exception (or null).
inline std::vector<std::exception_ptr> run_ranks(int size, const std::function<void(int)>& body) {
  std::vector<std::exception_ptr> errors(size);
  NodeSpawner ranks;
  for (int r = 0; r < size; ++r) {
    // Caught here, not by the spawner: a test asks what each rank threw.
    ranks.spawn("rank " + std::to_string(r), [&, r] {
      try {
        body(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  ranks.join();
  return errors;
}

// The message of `e` ("" for null or a non-std exception).
inline std::string message(const std::exception_ptr& e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
  }
  return "";
}

}  // namespace fedwan::testing
