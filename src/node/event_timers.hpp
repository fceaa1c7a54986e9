// Timers of a node's event loop on Boost.Asio: heartbeats, liveness checks
// and round deadlines. The loop owns the sockets and calls poll() on every
// turn (it wakes at least every next_wait()), so handlers run on the loop's
// thread and need no locks. Not thread safe: one owner thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

namespace fedwan::node {

class EventTimers {
 public:
  using Clock = std::chrono::steady_clock;
  using Handler = std::function<void()>;

  // A cancellable one-shot timer; cancelling (or destroying) it before it
  // fires means its handler never runs.
  class Timer {
   public:
    explicit Timer(boost::asio::io_context& io) : timer_(io) {}
    void cancel() { timer_.cancel(); }

   private:
    friend class EventTimers;
    boost::asio::steady_timer timer_;
  };

  // Runs `fn` every `period` (at least 1 ms), first one period from now,
  // until the object dies.
  void every(std::chrono::milliseconds period, Handler fn) {
    period = std::max(period, std::chrono::milliseconds(1));
    auto t = std::make_shared<Timer>(io_);
    periodic_.push_back(t);
    arm_periodic(t, period, std::move(fn));
  }

  // Runs `fn` once at `when` (replacing what `timer` was armed with).
  void at(Timer& timer, Clock::time_point when, Handler fn) {
    timer.timer_.expires_at(when);
    timer.timer_.async_wait([fn = std::move(fn)](const boost::system::error_code& ec) {
      if (!ec) fn();
    });
  }

  // The timer uses this object's io_context: it must be destroyed first
  // (an owner declares its EventTimers before the timers it makes).
  std::unique_ptr<Timer> make_timer() { return std::make_unique<Timer>(io_); }

  // Runs the handlers that are due, at most kMaxHandlersPerPoll of them, so
  // a timer that is always due cannot keep the loop from its sockets and its
  // stop flag; never blocks.
  void poll() {
    for (int i = 0; i < kMaxHandlersPerPoll && io_.poll_one() > 0; ++i) {
    }
    if (io_.stopped()) io_.restart();
  }
  static constexpr int kMaxHandlersPerPoll = 64;

 private:
  void arm_periodic(const std::shared_ptr<Timer>& t, std::chrono::milliseconds period, Handler fn) {
    t->timer_.expires_after(period);
    std::weak_ptr<Timer> weak = t;
    t->timer_.async_wait(
        [this, weak, period, fn = std::move(fn)](const boost::system::error_code& ec) mutable {
          auto self = weak.lock();
          if (ec || !self) return;
          fn();
          arm_periodic(self, period, std::move(fn));
        });
  }

  boost::asio::io_context io_;
  std::vector<std::shared_ptr<Timer>> periodic_;
};

}  // namespace fedwan::node
