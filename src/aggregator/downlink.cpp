#include "aggregator/downlink.hpp"

#include "common/log.hpp"
#include "fedwan/error.hpp"

namespace fedwan::aggregator {

void Outbox::push(Outgoing o, Clock::time_point now) {
  if (frames_.empty()) waiting_since_ = head_since_ = now;
  frames_.push_back(std::move(o));
}

void Outbox::pop(Clock::time_point now) {
  frames_.pop_front();
  sent_ += 1;
  waiting_since_ = head_since_ = now;
}

size_t Downlink::add(const std::string& id) {
  const size_t slot = ids_.size();
  ids_.push_back(id);
  slots_[id] = slot;
  out_.resize(ids_.size());
  return slot;
}

std::optional<size_t> Downlink::find(const std::string& id) const {
  auto it = slots_.find(id);
  if (it == slots_.end()) return std::nullopt;
  return it->second;
}

void Downlink::queue(size_t slot, StoredFrame frame, const wire::FrameHeader& h) {
  wire::FrameHeader sent = h;
  sent.payload_length = static_cast<uint32_t>(frame.size() - wire::kHeaderSize);
  out_[slot].push({std::move(frame), sent, nullptr}, Clock::now());
}

bool Downlink::flush(const OnSent& on_sent) {
  // What is left of frames going out in pieces first.
  if (link_) (void)link_->flush();
  // One frame per child in turn, as long as any window takes one: children
  // get the same frames (an anchor) at the same pace, rather than the first
  // child all of them before the next gets any; a child that gets its
  // anchor first would send its whole update ahead of the others', whose
  // chunks the aggregator would then hold for their last copies.
  for (bool progress = true; progress;) {
    progress = seal_turn(on_sent);
    for (size_t i = 0; i < out_.size(); ++i) {
      if (out_[i].empty()) continue;
      if (send_head(i, on_sent)) progress = true;
    }
  }
  return empty();
}

bool Downlink::seal_turn(const OnSent& on_sent) {
  if (!link_ || link_->crypto_threads() == 0) return false;
  std::vector<size_t> slots;
  std::vector<std::pair<std::string, const std::vector<uint8_t>*>> turn;
  for (size_t i = 0; i < out_.size(); ++i) {
    if (out_[i].empty() || !link_->may_seal_ahead(ids_[i])) continue;
    Outgoing& head = out_[i].front();
    if (!head.loaded) head.loaded = head.frame.load();
    slots.push_back(i);
    turn.emplace_back(ids_[i], head.loaded.get());
  }
  // One child's frame gains nothing from another thread: it is sealed as
  // it goes (send_head).
  if (turn.size() < 2) return false;
  const std::vector<std::optional<size_t>> sent = link_->seal_ahead(turn);
  bool any = false;
  for (size_t k = 0; k < slots.size(); ++k) {
    if (!sent[k]) continue;
    Outbox& box = out_[slots[k]];
    on_sent(box.front().header, *sent[k]);
    box.pop(Clock::now());
    any = true;
  }
  return any;
}

bool Downlink::send_head(size_t i, const OnSent& on_sent) {
  Outbox& box = out_[i];
  Outgoing& head = box.front();
  // A stored frame is read once, when it reaches the head (a read error is
  // the node's own disk failing: it ends the node).
  if (!head.loaded) head.loaded = head.frame.load();
  std::optional<size_t> sent;
  try {
    sent = link_->try_send(ids_[i], *head.loaded);
  } catch (const TransportError&) {
    // Not connected: a site that holds the final anchor may have left,
    // others are gone or reconnecting. What they missed reaches them as a
    // resync when they say hello again (aggregator_recovery.cpp).
    log().debug("[{}] '{}' is not connected; dropped {} queued frames", log_name_, ids_[i],
                box.size());
    box.clear();
    return false;
  }
  if (!sent) return false;
  on_sent(head.header, *sent);
  box.pop(Clock::now());
  return true;
}

bool Downlink::empty() const {
  for (const Outbox& box : out_) {
    if (!box.empty()) return false;
  }
  return !link_ || !link_->sending();
}

size_t Downlink::waiting() const {
  size_t n = 0;
  for (const Outbox& box : out_) n += box.size();
  // A frame still going out in pieces waits too.
  return n + (link_ && link_->sending() ? 1 : 0);
}

}  // namespace fedwan::aggregator
