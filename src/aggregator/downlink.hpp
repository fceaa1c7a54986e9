// What an aggregator sends waits in an outbox per peer: sending never blocks
// its event loop, frames go as the peer's window opens (Downlink::flush).
// What can wait is bounded by the protocol: one round's chunks per direction,
// and anchor frames are shared by every child's outbox (Frame is shared, not
// copied). The Downlink is the children's side: their link and an outbox per
// child slot, in the order of the aggregator's child table. Not thread safe:
// the aggregator's event loop owns it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "node/frame_store.hpp"
#include "transport/links.hpp"
#include "wire/frame.hpp"

namespace fedwan::aggregator {

using node::Frame;
using node::FrameStore;
using node::StoredFrame;

struct Outgoing {
  StoredFrame frame;         // in memory, or read back when its turn comes (node/frame_store.hpp)
  wire::FrameHeader header;  // with its payload length: the traffic ledger needs it
  Frame loaded;              // a stored frame's bytes, once read for the window
};

// The frames waiting for one peer, oldest first.
class Outbox {
 public:
  using Clock = std::chrono::steady_clock;

  // The head frame's wait starts when it reaches the head.
  void push(Outgoing o, Clock::time_point now);
  bool empty() const { return frames_.empty(); }
  size_t size() const { return frames_.size(); }
  const Outgoing& front() const { return frames_.front(); }
  Outgoing& front() { return frames_.front(); }
  // The head went: the next one starts waiting now.
  void pop(Clock::time_point now);
  void clear() { frames_.clear(); }
  // The peer says it is busy (it writes its checkpoint and reads nothing
  // meanwhile, wire::kFlagBusy): the head's wait counts from `now`.
  void peer_busy(Clock::time_point now) { waiting_since_ = now; }
  // The head frame has waited longer than `limit`: the peer is not reading.
  bool stuck(Clock::time_point now, Clock::duration limit) const {
    return !frames_.empty() && now - waiting_since_ > limit;
  }
  // The head frame has waited longer than `limit` since it reached the
  // head, whatever the peer said meanwhile: a peer may be busy for a while
  // (a checkpoint written), not for ever.
  bool held(Clock::time_point now, Clock::duration limit) const {
    return !frames_.empty() && now - head_since_ > limit;
  }
  uint64_t sent() const { return sent_; }

 private:
  std::deque<Outgoing> frames_;
  Clock::time_point waiting_since_;
  Clock::time_point head_since_;
  uint64_t sent_ = 0;
};

class Downlink {
 public:
  using Clock = Outbox::Clock;
  // A frame that went to a child, and the bytes it took on the wire.
  using OnSent = std::function<void(const wire::FrameHeader&, size_t)>;

  // `log_name` tags its log lines ("agg:ID").
  void open(std::unique_ptr<transport::ChildrenLink> link, std::string log_name) {
    link_ = std::move(link);
    log_name_ = std::move(log_name);
  }
  // For what is sent at once and never queued (heartbeats, refusals: a peer
  // that does not read must not hold them up), and the link's counters.
  transport::ChildrenLink& link() { return *link_; }
  const transport::ChildrenLink& link() const { return *link_; }

  // A slot for the child `id` (the next one): its outbox.
  size_t add(const std::string& id);
  size_t slot(const std::string& id) const { return slots_.at(id); }
  std::optional<size_t> find(const std::string& id) const;
  Outbox& outbox(size_t slot) { return out_[slot]; }
  const Outbox& outbox(size_t slot) const { return out_[slot]; }

  // Queues `frame` for the child in `slot`; `h` is the header it carries
  // (its payload length is taken from the frame: make_frame() sets it in
  // the bytes only).
  void queue(size_t slot, StoredFrame frame, const wire::FrameHeader& h);
  // Sends what the children's windows take, a frame per child in turn,
  // `on_sent` told of each frame (a frame sealed ahead when it is sealed:
  // it is the link's then, ChildrenLink::seal_ahead).
  // A child that is not connected loses what waited for it: it reaches it
  // as a resync when it says hello again. True when every outbox is empty.
  bool flush(const OnSent& on_sent);
  bool empty() const;
  size_t waiting() const;  // frames, over every outbox

 private:
  // Sends the head of child i's outbox if its window takes it.
  bool send_head(size_t i, const OnSent& on_sent);
  // With crypto threads on the link: the heads of the outboxes of every
  // child that can take a frame sealed ahead, sealed together (one turn
  // of flush()'s, on several cores); true when any was.
  bool seal_turn(const OnSent& on_sent);

  std::string log_name_;
  std::unique_ptr<transport::ChildrenLink> link_;
  std::vector<std::string> ids_;  // by slot
  std::unordered_map<std::string, size_t> slots_;
  std::vector<Outbox> out_;  // by slot
};

}  // namespace fedwan::aggregator
