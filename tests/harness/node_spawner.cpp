#include "harness/node_spawner.hpp"

namespace fedwan::testing {

NodeStopper::Binding NodeStopper::bind(std::function<void()> stop) {
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = std::move(stop);
  if (stopping_) stop_();
  return Binding(this);
}

void NodeStopper::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  if (stop_) stop_();
}

void NodeStopper::unbind() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = nullptr;
}

NodeSpawner::~NodeSpawner() {
  stop();
  join();
}

void NodeSpawner::start(std::string who, std::function<void(NodeStopper&)> body,
                        std::function<void()> stop) {
  Node& node = nodes_.emplace_back();
  node.who = std::move(who);
  node.stop = std::move(stop);
  node.thread = std::thread([this, &node, body = std::move(body)]() mutable {
    try {
      body(node.stopper);
    } catch (const std::exception& e) {
      record(node.who + ": " + e.what(), std::current_exception());
    } catch (...) {
      record(node.who + ": an exception not derived from std::exception", std::current_exception());
    }
  });
}

void NodeSpawner::record(std::string error, std::exception_ptr thrown) {
  std::lock_guard<std::mutex> lock(mu_);
  errors_.push_back(std::move(error));
  if (!first_error_) first_error_ = std::move(thrown);
}

void NodeSpawner::stop() {
  for (Node& n : nodes_) {
    if (n.stop) n.stop();
    n.stopper.stop();
  }
}

void NodeSpawner::join() {
  for (Node& n : nodes_) {
    if (n.thread.joinable()) n.thread.join();
  }
  nodes_.clear();
}

std::string NodeSpawner::errors() const {
  std::string out;
  for (const std::string& e : error_list()) out += e + "\n";
  return out;
}

std::vector<std::string> NodeSpawner::error_list() const {
  std::lock_guard<std::mutex> lock(mu_);
  return errors_;
}

void NodeSpawner::rethrow_first_error() const {
  std::exception_ptr first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = first_error_;
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace fedwan::testing
