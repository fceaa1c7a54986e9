// NodeSpawner (harness/node_spawner.hpp): nodes run as threads, their errors
// come back as "who: what" with the first one rethrown as it was thrown, and
// a spawner left early stops and joins what still runs instead of hanging.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include "harness/node_spawner.hpp"

namespace fedwan::testing {
namespace {

using namespace std::chrono_literals;

// A node whose run() blocks until stop(), as an Aggregator's does.
class BlockingNode {
 public:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stopped_; });
    returned_ = true;
  }
  void stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    stops_ += 1;
    cv_.notify_all();
  }
  int stops() {
    std::lock_guard<std::mutex> lock(mu_);
    return stops_;
  }
  bool returned() {
    std::lock_guard<std::mutex> lock(mu_);
    return returned_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  bool returned_ = false;
  int stops_ = 0;
};

// Spins (politely) until `done`, at most 5 s.
template <typename F>
bool eventually(F done) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(NodeSpawner, RunsEachNodeOnAThreadOfItsOwn) {
  std::mutex mu;
  std::set<std::thread::id> ids;
  NodeSpawner nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.spawn("node-" + std::to_string(i), [&] {
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
    });
  }
  nodes.join();
  EXPECT_EQ(nodes.errors(), "");
  EXPECT_NO_THROW(nodes.rethrow_first_error());
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids.count(std::this_thread::get_id()), 0u);
}

TEST(NodeSpawner, ReportsWhoFailedInOrderAndRethrowsTheFirstAsThrown) {
  std::atomic<bool> first_failed{false};
  NodeSpawner nodes;
  nodes.spawn("eu", [&] {
    first_failed = true;  // set before the throw is recorded: "us" waits a little more
    throw std::invalid_argument("bad chunk");
  });
  nodes.spawn("us", [&] {
    ASSERT_TRUE(eventually([&] { return first_failed.load(); }));
    std::this_thread::sleep_for(50ms);
    throw 42;
  });
  nodes.spawn("asia", [] {});
  nodes.join();
  EXPECT_EQ(nodes.errors(), "eu: bad chunk\nus: an exception not derived from std::exception\n");
  EXPECT_EQ(nodes.error_list().size(), 2u);
  EXPECT_THROW(nodes.rethrow_first_error(), std::invalid_argument);
}

TEST(NodeSpawner, LeavingItsScopeStopsAndJoinsWhatStillRuns) {
  BlockingNode built_here;
  BlockingNode built_there;
  std::atomic<bool> there_bound{false};
  {
    NodeSpawner nodes;
    nodes.spawn_node("here", built_here);
    nodes.spawn("there", [&](NodeStopper& stopper) {
      const auto bound = stopper.bind([&] { built_there.stop(); });
      there_bound = true;
      built_there.run();
    });
    ASSERT_TRUE(eventually([&] { return there_bound.load(); }));
    // No join: a test that fails here returns, and the destructor must not hang.
  }
  EXPECT_TRUE(built_here.returned());
  EXPECT_TRUE(built_there.returned());
  EXPECT_EQ(built_here.stops(), 1);
}

TEST(NodeSpawner, AStopAskedBeforeTheNodeExistsReachesItAtBind) {
  std::atomic<bool> stop_asked{false};
  BlockingNode node;
  NodeSpawner nodes;
  nodes.spawn("late", [&](NodeStopper& stopper) {
    ASSERT_TRUE(eventually([&] { return stop_asked.load(); }));
    const auto bound = stopper.bind([&] { node.stop(); });  // stops it at once
    node.run();
  });
  nodes.stop();
  stop_asked = true;
  nodes.join();
  EXPECT_EQ(nodes.errors(), "");
  EXPECT_TRUE(node.returned());
  EXPECT_EQ(node.stops(), 1);
}

TEST(NodeSpawner, AStopAfterTheBindingEndsNeverReachesTheNode) {
  std::atomic<bool> unbound{false};
  std::atomic<bool> stopped{false};
  int calls = 0;  // written by the stop, which must never run
  NodeSpawner nodes;
  nodes.spawn("gone", [&](NodeStopper& stopper) {
    {
      const auto bound = stopper.bind([&] { ++calls; });
    }
    unbound = true;
    ASSERT_TRUE(eventually([&] { return stopped.load(); }));
  });
  ASSERT_TRUE(eventually([&] { return unbound.load(); }));
  nodes.stop();
  stopped = true;
  nodes.join();
  EXPECT_EQ(nodes.errors(), "");
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace fedwan::testing
