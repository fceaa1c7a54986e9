// Runs the nodes of a test (aggregators, sites, a parent played by hand) as
// threads, like gloo's spawn(): each node is a callable on its own thread;
// what it throws is kept as "who: what". The destructor first asks every
// node still running to stop, then joins, so a test that fails half-way
// neither hangs until the nodes' own timeouts nor dies on a joinable thread.
//
//   NodeSpawner nodes;
//   nodes.spawn_node("us", us);                        // a node built here
//   nodes.spawn("site-0", [&](NodeStopper& stopper) {  // a node built there
//     SiteCore site(...);
//     const auto bound = stopper.bind([&] { site.stop(); });
//     ...
//   });
//   ...
//   nodes.join();
//   ASSERT_EQ(nodes.errors(), "");
//
// Declare the spawner after what its nodes use (it must be destroyed first).
// Thread safety: one thread (the test's) spawns, stops and joins; the nodes
// report their errors through it from their own threads.
#pragma once

#include <exception>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace fedwan::testing {

// Stops the node a spawned thread builds for itself. The thread binds the
// node's stop() once the node exists and keeps the Binding until just before
// the node is destroyed; a stop asked for before bind() reaches the node at
// bind(). The stop callable must be safe from any thread (Aggregator::stop
// and SiteCore::stop are).
class NodeStopper {
 public:
  class [[nodiscard]] Binding {
   public:
    Binding(Binding&& other) noexcept : stopper_(std::exchange(other.stopper_, nullptr)) {}
    Binding& operator=(Binding&&) = delete;
    ~Binding() {
      if (stopper_ != nullptr) stopper_->unbind();
    }

   private:
    friend class NodeStopper;
    explicit Binding(NodeStopper* stopper) : stopper_(stopper) {}
    NodeStopper* stopper_;
  };

  NodeStopper() = default;
  NodeStopper(const NodeStopper&) = delete;
  NodeStopper& operator=(const NodeStopper&) = delete;

  Binding bind(std::function<void()> stop);
  // Calls the bound stop now, or at bind(). Does not wait.
  void stop();

 private:
  void unbind();

  std::mutex mu_;  // a stop never runs on a node being destroyed
  std::function<void()> stop_;
  bool stopping_ = false;
};

class NodeSpawner {
 public:
  NodeSpawner() = default;
  ~NodeSpawner();
  NodeSpawner(const NodeSpawner&) = delete;
  NodeSpawner& operator=(const NodeSpawner&) = delete;

  // Runs `body` on a new thread as node `who`. `body` takes no argument, or
  // a NodeStopper& to bind the node it builds; `stop`, when given, stops a
  // node built outside (it may run after `body` returned, until join()).
  template <typename Body>
  void spawn(std::string who, Body body, std::function<void()> stop = {}) {
    if constexpr (std::is_invocable_v<Body&, NodeStopper&>) {
      start(std::move(who), std::function<void(NodeStopper&)>(std::move(body)), std::move(stop));
    } else {
      start(
          std::move(who), [body = std::move(body)](NodeStopper&) mutable { body(); },
          std::move(stop));
    }
  }

  // Runs node.run() as node `who`; node.stop() stops it (an Aggregator, a
  // SiteCore built by the test). `node` must outlive join().
  template <typename Node>
  void spawn_node(std::string who, Node& node) {
    const auto run = [&node] { node.run(); };
    spawn(std::move(who), run, [&node] { node.stop(); });
  }

  // Asks every node still running to stop; does not wait.
  void stop();
  // Waits for every node spawned so far.
  void join();

  // "who: what\n" for every node that threw, in the order they failed; ""
  // when none did. Complete after join().
  std::string errors() const;
  std::vector<std::string> error_list() const;
  // After join(): throws again what the first node to fail threw, as it was
  // thrown (for a test that checks its type); returns when none failed.
  void rethrow_first_error() const;

 private:
  struct Node {
    std::string who;
    std::function<void()> stop;  // for a node built outside its thread
    NodeStopper stopper;         // for a node its thread builds
    std::thread thread;
  };

  void start(std::string who, std::function<void(NodeStopper&)> body, std::function<void()> stop);
  void record(std::string error, std::exception_ptr thrown);

  mutable std::mutex mu_;  // guards errors_ and first_error_
  std::vector<std::string> errors_;
  std::exception_ptr first_error_;
  std::list<Node> nodes_;  // a list: threads keep pointers to their Node
};

}  // namespace fedwan::testing
