// ChildrenLink's work on its crypto threads (crypto_workers.hpp). Reading
// ahead: messages taken off the socket while the owner handles the frame
// recv() returned, their opening (decryption and authentication) on the
// threads, and each taken back in its turn as take_frame() would have
// taken it. Sealing ahead: one frame for each of several children, sealed
// on the threads and the owner's at once, each held to go first to its
// child.
#include <chrono>
#include <exception>
#include <set>
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
  if (!workers_ || taken_.empty()) return true;
  // Room for every thread's frame and the next one's, no more: what is read
  // ahead is memory held, and a frame read early waits as long as the
  // owner takes to get to it.
  return taken_undetached_ == 0 && taken_.size() < 2 * workers_->threads() + 1;
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
    t->job.inspect = &inspect_;
    if (t->detached->payload() >= kOnThreadFrom) {
      workers_->submit(&t->job);
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
    while (!workers_->wait(&t->job, std::chrono::milliseconds(100))) {
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
  // Small frames are not inspected: they are opened here, in their turn.
  return settle(std::move(t->peer), t->stripe, t->in, std::move(t->job.inspected), r, frame_size,
                security, out);
}

bool ChildrenLink::may_seal_ahead(const std::string& child) const {
  if (held_.count(child) || out_.count(child) || suspended_.count(child)) return false;
  const auto it = security_.find(child);
  return it != security_.end() && it->second->established();
}

std::vector<std::optional<size_t>> ChildrenLink::seal_ahead(
    const std::vector<std::pair<std::string, const std::vector<uint8_t>*>>& frames) {
  std::vector<std::optional<size_t>> sent(frames.size());
  std::vector<std::vector<uint8_t>> sealed(frames.size());
  std::vector<std::exception_ptr> failed(frames.size());
  std::vector<size_t> taken;  // indices of frames
  std::set<std::string> seen;
  for (size_t i = 0; i < frames.size(); ++i) {
    if (may_seal_ahead(frames[i].first) && seen.insert(frames[i].first).second) taken.push_back(i);
  }
  const auto seal = [&](size_t i) {
    try {
      sealed[i] = security_for(frames[i].first).sealed(*frames[i].second);
    } catch (...) {
      failed[i] = std::current_exception();
    }
  };
  // Every (threads + 1)-th on this thread, the rest on the link's threads.
  const size_t share = workers_ ? workers_->threads() + 1 : 1;
  std::vector<std::unique_ptr<CryptoWorkers::Job>> jobs;
  for (size_t k = 0; k < taken.size(); ++k) {
    if (k % share == 0) continue;
    auto job = std::make_unique<CryptoWorkers::Job>();
    // Each child's channel is found here, on the owner's thread.
    ChannelSecurity* security = &security_for(frames[taken[k]].first);
    const std::vector<uint8_t>* frame = frames[taken[k]].second;
    std::vector<uint8_t>* out = &sealed[taken[k]];
    job->task = [security, frame, out] { *out = security->sealed(*frame); };
    workers_->submit(job.get());
    jobs.push_back(std::move(job));
  }
  for (size_t k = 0; k < taken.size(); k += share) seal(taken[k]);
  for (size_t k = 0, j = 0; k < taken.size(); ++k) {
    if (k % share == 0) continue;
    CryptoWorkers::Job& job = *jobs[j++];
    // Sealing takes a millisecond at most, and the job's bytes are the
    // thread's until it ends: never given up on.
    while (!workers_->wait(&job, std::chrono::milliseconds(100))) {
    }
    failed[taken[k]] = job.error;
  }
  std::exception_ptr first;
  for (const size_t i : taken) {
    if (failed[i]) {
      if (!first) first = failed[i];
      continue;
    }
    const std::string& child = frames[i].first;
    const size_t n = sealed[i].size();
    if (fragmenting_to(child, n)) {
      out_.insert_or_assign(child, Fragmenter(std::move(sealed[i]), next_fragment_id_++));
    } else {
      held_[child] = std::move(sealed[i]);
    }
    count_sent(child, n);
    sent[i] = n;
  }
  for (const size_t i : taken) {
    if (sent[i]) (void)flush(frames[i].first);
  }
  if (first) std::rethrow_exception(first);
  return sent;
}

}  // namespace fedwan::transport
