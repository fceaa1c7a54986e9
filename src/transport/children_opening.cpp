// ChildrenLink's reading ahead: messages taken off the socket while the
// owner handles the frame recv() returned, their opening (decryption and
// authentication) on the link's opening threads, and each taken back in
// its turn as take_frame() would have taken it.
#include <chrono>
#include <exception>
#include <string>
#include <utility>

#include "security/aead.hpp"
#include "transport/links.hpp"

namespace fedwan::transport {

namespace {

// Below this a frame is opened in its turn on the owner's thread: handing
// it to another costs about what opening it does (heartbeats, small
// control frames).
constexpr size_t kOnThreadFrom = 16 << 10;

}  // namespace

bool ChildrenLink::reading_ahead() const {
  if (!openers_ || taken_.empty()) return true;
  // Room for every thread's frame and the next one's, no more: what is read
  // ahead is memory held, and a frame read early waits as long as the
  // owner takes to get to it.
  return taken_undetached_ == 0 && taken_.size() < 2 * openers_->threads() + 1;
}

void ChildrenLink::queue_taken(std::string peer, size_t stripe, Received& in, bool pieced) {
  auto t = std::make_unique<Taken>();
  t->peer = std::move(peer);
  t->stripe = stripe;
  t->in = std::move(in);
  t->pieced = pieced;
  if (taken_undetached_ == 0) {
    t->detached = security_for(t->peer).detach(t->in.message.data(), t->in.message.size());
  }
  if (t->detached) {
    t->job.frame = t->detached.get();
    t->job.data = t->in.message.data();
    if (t->detached->payload() >= kOnThreadFrom) {
      openers_->submit(&t->job);
      t->on_thread = true;
    }
  } else {
    taken_undetached_ += 1;
  }
  taken_.push_back(std::move(t));
}

bool ChildrenLink::take_oldest(Incoming* out) {
  std::unique_ptr<Taken> t = std::move(taken_.front());
  taken_.pop_front();
  taking_pieced_ = t->pieced;
  taking_long_ = t->in.long_link;
  if (!t->detached) {
    taken_undetached_ -= 1;
    return take_frame(std::move(t->peer), t->stripe, t->in, out);
  }
  if (t->on_thread) {
    // Opening takes a millisecond at most; the bytes are the thread's until
    // it is done, so it is never given up on.
    while (!openers_->wait(&t->job, std::chrono::milliseconds(100))) {
    }
    if (t->job.error) std::rethrow_exception(t->job.error);
  } else {
    t->job.authenticated = t->detached->run(t->job.data, &own_cipher_);
  }
  std::string why;
  size_t frame_size = 0;
  ChannelSecurity& security = security_for(t->peer);
  const auto r = security.finish(*t->detached, t->job.authenticated, t->in.message.data(),
                                 t->in.message.size(), &frame_size, &why);
  return settle(std::move(t->peer), t->stripe, t->in, r, frame_size, security, out);
}

}  // namespace fedwan::transport
