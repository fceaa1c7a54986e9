// A parent's link that opens its children's frames on threads of its own
// (LinkOptions::crypto_threads): every frame comes whole and in the order
// its child sent it, whatever thread opened it, and a frame changed on the
// way or sent twice is refused as it is without them, the rest going on.
// And the owner's own work split in parts over them (run_parts).
#include <any>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "striped_links_fixture.hpp"

namespace fedwan::transport::striped {
namespace {

constexpr size_t kBig = 40 << 10;  // opened on a thread
constexpr size_t kSmall = 3000;    // opened in its turn on the owner's

// Every fifth frame small: both kinds interleave in one child's order.
size_t payload_of(uint32_t n) { return n % 5 == 4 ? kSmall : kBig; }

// A frame's number, once its size and every byte of it checked.
uint32_t whole_number(const Incoming& in) {
  const uint32_t k = number_of(in);
  const size_t body = in.frame_size - wire::kHeaderSize;
  EXPECT_EQ(body, payload_of(k));
  const uint8_t* p = in.data() + wire::kHeaderSize;
  EXPECT_TRUE(std::all_of(p, p + body, [&](uint8_t b) { return b == uint8_t(k); }))
      << "frame " << k << " from " << in.peer;
  return k;
}

class CryptoThreads : public StripedLinks {
 protected:
  void start(int threads) {
    LinkOptions o;
    o.crypto_threads = threads;
    start_parent(5000ms, o);
    ASSERT_EQ(children_->crypto_threads(), size_t(threads));
  }

  // Sends `n` numbered frames up from each child, at most one each per
  // turn, and takes what the parent delivers until each child's count came
  // (`short_by` fewer than sent for a child named there); checks every
  // frame's bytes.
  void send_up(std::vector<std::pair<std::string, ParentLink*>> children, uint32_t n,
               std::map<std::string, size_t> short_by = {}) {
    std::map<std::string, uint32_t> sent;
    const auto end = Clock::now() + 20s;
    while (Clock::now() < end) {
      for (auto& [id, link] : children) {
        const uint32_t k = sent[id];
        if (k < n && link->try_send(numbered(*topo_, topo_->node(id).index, k, payload_of(k)))) {
          sent[id] = k + 1;
        }
        Incoming ignored;
        while (link->recv(&ignored, 0ms)) {
        }
      }
      Incoming in;
      while (children_->recv(&in, 0ms)) {
        got_[in.peer].push_back(whole_number(in));
        if (check_) check_(in);
      }
      bool all = true;
      for (auto& [id, link] : children) all = all && got_[id].size() + short_by[id] >= n;
      if (all && !children_->holding()) return;
      std::this_thread::sleep_for(1ms);
    }
    ADD_FAILURE() << "not every frame came";
  }

  std::map<std::string, std::vector<uint32_t>> got_;
  std::function<void(const Incoming&)> check_;  // on each frame delivered
};

// What the inspector below saw of a frame.
struct Seen {
  std::thread::id thread;
  uint32_t number = 0;
  size_t size = 0;
  uint64_t sum = 0;  // of the payload's bytes
};

// Throws on every frame whose number is 3 more than a multiple of 7.
FrameInspector seeing() {
  return [](const uint8_t* frame, size_t size) -> std::any {
    Seen s;
    s.thread = std::this_thread::get_id();
    std::memcpy(&s.number, frame + 28, 4);
    if (s.number % 7 == 3) throw std::runtime_error("an inspector that failed");
    s.size = size;
    for (size_t i = wire::kHeaderSize; i < size; ++i) s.sum += frame[i];
    return s;
  };
}

// The inspector's answer comes with the frame it saw, worked out on a
// crypto thread from the opened bytes (the sum of the plain payload): for
// each big frame but those it threw on, and for no small one (opened on the
// owner's thread), over one connection and over a striped child's three.
class FrameInspection : public CryptoThreads {
 protected:
  void send_and_check(int streams) {
    start(2);
    children_->inspect_opened(seeing());
    size_t answered = 0;
    check_ = [&](const Incoming& in) {
      const uint32_t k = number_of(in);
      const auto* seen = std::any_cast<Seen>(&in.inspected);
      if (payload_of(k) == kSmall || k % 7 == 3) {
        EXPECT_FALSE(in.inspected.has_value()) << "frame " << k;
        return;
      }
      ASSERT_NE(seen, nullptr) << "frame " << k;
      answered += 1;
      EXPECT_EQ(seen->number, k);
      EXPECT_EQ(seen->size, in.frame_size);
      EXPECT_EQ(seen->sum, uint64_t(k % 256) * kBig) << "what it saw was opened";
      EXPECT_NE(seen->thread, std::this_thread::get_id());
    };
    auto a = connect("a", streams);
    send_up({{"a", a.get()}}, 70);
    EXPECT_EQ(sorted(got_["a"]), iota(70));
    // 70 less 14 small ones and 8 big ones it threw on (3, 10, ..., 66 but 24 and 59).
    EXPECT_EQ(answered, 48u);
    check_ = nullptr;
  }
};

TEST_F(FrameInspection, AnAnswerComesWithTheFrameItSaw) { send_and_check(1); }

TEST_F(FrameInspection, AStripedChildsAnswersComeThroughItsReordering) { send_and_check(3); }

TEST_F(CryptoThreads, FramesOpenedOnThreadsComeWholeAndInTheirOrder) {
  start(2);
  auto a = connect("a", 1);
  auto b = connect("b", 1);
  send_up({{"a", a.get()}, {"b", b.get()}}, 150);
  EXPECT_EQ(got_["a"], iota(150));
  EXPECT_EQ(got_["b"], iota(150));
  EXPECT_EQ(children_->counters().rejected, 0u);
}

// Over three connections chunks come as they arrive (a chunk may overtake
// another: links.hpp), each once and whole.
TEST_F(CryptoThreads, AStripedChildsFramesComeEachOnceAndWhole) {
  start(2);
  auto a = connect("a", 3);
  send_up({{"a", a.get()}}, 150);
  EXPECT_EQ(sorted(got_["a"]), iota(150));
}

TEST_F(CryptoThreads, AFrameChangedOnTheWayOrSentTwiceIsRefusedAndTheRestGoOn) {
  // Frame 7 of a's has a bit of its ciphertext flipped; frame 11 of b's and
  // the small frame 14 of a's arrive twice.
  const auto is = [](uint32_t k) {
    return [k](const uint8_t* d, size_t size) {
      uint32_t index = 0;
      if (size >= wire::kHeaderSize) std::memcpy(&index, d + 28, 4);
      return size >= wire::kHeaderSize && index == k;
    };
  };
  const auto flipped = faults_->add(FaultRule::corrupt(wire::kHeaderSize + 100)
                                        .on(endpoint(), "a")
                                        .up()
                                        .of_type(wire::MsgType::kDelta)
                                        .where(is(7)));
  const auto twice_b =
      faults_->add(FaultRule::duplicate().on(endpoint(), "b").up().where(is(11)).first(1));
  const auto twice_a =
      faults_->add(FaultRule::duplicate().on(endpoint(), "a").up().where(is(14)).first(1));
  start(2);
  auto a = connect("a", 1);
  auto b = connect("b", 1);
  send_up({{"a", a.get()}, {"b", b.get()}}, 40, {{"a", 1}});
  EXPECT_EQ(faults_->hits(flipped), 1u);
  EXPECT_EQ(faults_->hits(twice_b), 1u);
  EXPECT_EQ(faults_->hits(twice_a), 1u);
  std::vector<uint32_t> without_7 = iota(40);
  without_7.erase(without_7.begin() + 7);
  EXPECT_EQ(got_["a"], without_7);
  EXPECT_EQ(got_["b"], iota(40));
  EXPECT_EQ(children_->counters().rejected, 3u);
}

// The same traffic with and without threads: the same frames, the same
// refusals (the threads change where frames are opened, nothing else).
TEST_F(CryptoThreads, WithoutThreadsTheLinkOpensOnItsOwnThread) {
  start(0);
  auto a = connect("a", 1);
  send_up({{"a", a.get()}}, 60);
  EXPECT_EQ(got_["a"], iota(60));
  EXPECT_FALSE(children_->holding());
}

// Frames sealed ahead for several children at once go first to each, whole
// and in the order sealed, before what is sent to it after; a child without
// a session is skipped.
TEST_F(CryptoThreads, FramesSealedAheadGoFirstToEachChildInOrder) {
  start(1);
  auto a = connect("a", 1);
  auto b = connect("b", 1);
  std::map<std::string, ParentLink*> links = {{"a", a.get()}, {"b", b.get()}};
  std::map<std::string, std::vector<uint32_t>> down;
  const auto take = [&] {
    Incoming in;
    while (children_->recv(&in, 0ms)) {
    }
    for (auto& [id, link] : links) {
      while (link->recv(&in, 0ms)) down[id].push_back(whole_number(in));
    }
  };
  const auto end = Clock::now() + 20s;
  while (!(children_->established("a") && children_->established("b")) && Clock::now() < end) {
    take();
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(children_->established("a") && children_->established("b"));
  // 0..59 sealed ahead two children at a time (with one that has no
  // session), then 60 sent as usual.
  uint32_t k = 0;
  while (k < 60 && Clock::now() < end) {
    if (children_->may_seal_ahead("a") && children_->may_seal_ahead("b")) {
      const auto fa = numbered(*topo_, 0, k, payload_of(k));
      const auto fb = fa;
      const auto fc = fa;
      const auto sent = children_->seal_ahead({{"a", &fa}, {"c", &fc}, {"b", &fb}});
      ASSERT_EQ(sent.size(), 3u);
      EXPECT_TRUE(sent[0].has_value() && *sent[0] > fa.size()) << "sealed, with its trailer";
      EXPECT_FALSE(sent[1].has_value()) << "c has no session";
      EXPECT_TRUE(sent[2].has_value());
      ++k;
    }
    (void)children_->flush();
    take();
  }
  for (const std::string id : {"a", "b"}) {
    while (!children_->try_send(id, numbered(*topo_, 0, 60, payload_of(60))) &&
           Clock::now() < end) {
      take();
    }
  }
  while ((down["a"].size() < 61 || down["b"].size() < 61) && Clock::now() < end) take();
  EXPECT_EQ(down["a"], iota(61));
  EXPECT_EQ(down["b"], iota(61));
  EXPECT_FALSE(children_->sending());
}

// The operator's setting: a number of threads within bounds, or a clear
// error; unset, what the cores allow.
TEST(CryptoThreadsSetting, FromTheEnvironmentWithinBounds) {
  const char* before = std::getenv("FEDWAN_CRYPTO_THREADS");
  const std::string saved = before != nullptr ? before : "";
  ::setenv("FEDWAN_CRYPTO_THREADS", "2", 1);
  EXPECT_EQ(CryptoWorkers::default_threads(), 2u);
  ::setenv("FEDWAN_CRYPTO_THREADS", "0", 1);
  EXPECT_EQ(CryptoWorkers::default_threads(), 0u);
  for (const char* bad : {"17", "-1", "two", "1000", " 1"}) {
    ::setenv("FEDWAN_CRYPTO_THREADS", bad, 1);
    EXPECT_THROW(CryptoWorkers::default_threads(), ConfigError) << bad;
  }
  ::unsetenv("FEDWAN_CRYPTO_THREADS");
  EXPECT_LE(CryptoWorkers::default_threads(), 3u);
  if (before != nullptr) ::setenv("FEDWAN_CRYPTO_THREADS", saved.c_str(), 1);
  EXPECT_THROW(CryptoWorkers(0), ConfigError);
}

// The owner's work in parts: each part runs once, whatever the number; an
// error comes back only after every part ran, the first in part order.
TEST(CryptoWorkersParts, EachPartRunsOnceAndTheFirstErrorComesBack) {
  CryptoWorkers w(2);
  for (const size_t parts : {size_t(0), size_t(1), size_t(2), size_t(3), size_t(7)}) {
    std::vector<std::atomic<int>> runs(parts);
    w.run_parts(parts, [&](size_t p) { runs[p] += 1; });
    for (size_t p = 0; p < parts; ++p) EXPECT_EQ(runs[p].load(), 1) << p << " of " << parts;
  }
  std::vector<std::atomic<int>> runs(5);
  try {
    w.run_parts(5, [&](size_t p) {
      runs[p] += 1;
      if (p == 1 || p == 3) throw std::runtime_error("part " + std::to_string(p));
    });
    ADD_FAILURE() << "no error came back";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "part 1");
  }
  for (size_t p = 0; p < runs.size(); ++p) EXPECT_EQ(runs[p].load(), 1) << p;
}

// A pool whose every thread is busy elsewhere does not hold its owner up:
// the parts no thread took run on the owner's thread.
TEST(CryptoWorkersParts, ThreadsBusyElsewhereLeaveThePartsToTheOwner) {
  CryptoWorkers w(1);
  std::atomic<bool> started{false}, release{false};
  CryptoWorkers::Job blocker;
  blocker.task = [&] {
    started = true;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  w.submit(&blocker);
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::mutex mu;
  std::set<std::thread::id> ran_on;
  w.run_parts(4, [&](size_t) {
    std::lock_guard<std::mutex> lock(mu);
    ran_on.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ran_on, std::set<std::thread::id>{std::this_thread::get_id()});
  release = true;
  EXPECT_TRUE(w.wait(&blocker, std::chrono::seconds(10)));
}

}  // namespace
}  // namespace fedwan::transport::striped
