// A stand-in for a root's end of the links to its children (or its
// standby's), under the root's credentials, for tests of a child's sessions
// with a root that has a standby. It runs its link only while `serving` is
// true: before, a child's ClientHello waits unanswered, as at a root too
// busy to run its loop. Serving, it counts the hellos it gets and, unless
// `mute`, answers as a live root does before its first round: a replica
// request with "none kept here", and a child that said hello with a
// heartbeat every 100 ms. Mute, it completes TLS and answers nothing, as a
// passive standby does while its root lives. A test may script the answer
// to a hello (`on_hello`, set before `serving`) and silence the heartbeats
// (`silent`), and have the next frame a child seals answered with a plain
// "no session here" as someone on the path could forge it
// (`forge_no_session`: the session stays up). Runs its own thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "fedwan/error.hpp"
#include "harness/federation_fixture.hpp"
#include "node/node_config.hpp"
#include "node/node_frames.hpp"
#include "node/node_security.hpp"
#include "transport/channel_security.hpp"
#include "transport/links.hpp"
#include "transport/transport.hpp"
#include "wire/frame.hpp"

namespace fedwan::testing {

// A parent's end of one child's session, unchanged except that, while
// `*forge` is set, the next sealed frame it opens is answered with a plain
// "no session here" (wire::kFlagNoSession) beside it, once. It detaches
// nothing: every frame passes through receive() here.
class NoSessionForgingChannel final : public transport::ChannelSecurity {
 public:
  NoSessionForgingChannel(std::unique_ptr<ChannelSecurity> inner, std::atomic<bool>* forge,
                          uint64_t job_id, uint32_t self_index)
      : inner_(std::move(inner)), forge_(forge), job_id_(job_id), self_index_(self_index) {}
  std::string_view name() const override { return inner_->name(); }
  bool established() const override { return inner_->established(); }
  const std::string& failure() const override { return inner_->failure(); }
  bool failure_is_final() const override { return inner_->failure_is_final(); }
  void start(transport::SecurityReplies* out) override { inner_->start(out); }
  void seal(std::vector<uint8_t>& bytes) override { inner_->seal(bytes); }
  Inbound receive(uint8_t* data, size_t size, size_t* frame_size, std::string* why,
                  transport::SecurityReplies* out) override {
    const Inbound r = inner_->receive(data, size, frame_size, why, out);
    if (r == Inbound::kFrame && forge_->exchange(false)) {
      out->push_back(transport::no_session_frame(job_id_, self_index_));
    }
    return r;
  }
  Inbound sealed_before_any_session(std::string reason, uint64_t bytes, std::string* why,
                                    transport::SecurityReplies* out) override {
    return inner_->sealed_before_any_session(std::move(reason), bytes, why, out);
  }
  std::optional<Order> last_order() const override { return inner_->last_order(); }
  uint64_t key_agreements() const override { return inner_->key_agreements(); }
  bool handshaking() const override { return inner_->handshaking(); }
  void abandon_handshake() override { inner_->abandon_handshake(); }

 private:
  std::unique_ptr<ChannelSecurity> inner_;
  std::atomic<bool>* forge_;
  uint64_t job_id_;
  uint32_t self_index_;
};

class FakeRoot {
 public:
  FakeRoot(const Topology& topo, const std::string& bind, bool mute)
      : topo_(topo),
        config_(topo, topo.root(), node::NodeOverrides{}),
        security_(security_for(topo, topo.root().id), topo, topo.root()),
        transport_(transport::make_transport(bind)),
        link_(*transport_, bind, config_.link, forging(security_.children_factory()),
              security_.children_admission()),
        mute_(mute),
        thread_([this] { loop(); }) {}
  ~FakeRoot() {
    stop_ = true;
    thread_.join();
  }
  FakeRoot(const FakeRoot&) = delete;
  FakeRoot& operator=(const FakeRoot&) = delete;

  std::atomic<bool> serving{false};
  // While set, no heartbeats go (a child then judges this root silent).
  std::atomic<bool> silent{false};
  // While set, the next frame a child seals is answered with a plain "no
  // session here" (then it clears): a forged word, from a root that lives.
  std::atomic<bool> forge_no_session{false};
  // Answers a hello that is not a replica request instead of the default
  // (the child heartbeated from then on), on the loop's thread.
  std::function<void(FakeRoot&, const std::string& child, const wire::ParsedFrame& hello)> on_hello;
  // Gets every other frame from a child (its update's chunks, ...), on the
  // loop's thread; unset, they are dropped.
  std::function<void(FakeRoot&, const std::string& child, const wire::ParsedFrame& f)> on_other;
  // Hellos received while serving, and of them replica requests.
  int hellos() const { return hellos_.load(); }
  int replica_requests() const { return replica_requests_.load(); }

  // A frame from this root to `child` (on the loop's thread: from on_hello).
  void send(const std::string& child, wire::FrameHeader h, const std::vector<uint8_t>& payload) {
    try {
      (void)link_.try_send(child, node::make_frame(h, payload));
    } catch (const Error&) {
      // Between sessions: the child says hello again on its next one.
    }
  }
  wire::FrameHeader header(wire::MsgType type, uint64_t round = 0) const {
    return node::node_header(topo_, topo_.root().index, type, round);
  }

 private:
  using Clock = std::chrono::steady_clock;

  transport::SecurityFactory forging(transport::SecurityFactory inner) {
    return [this, inner = std::move(inner)](const std::string& peer) {
      return std::make_unique<NoSessionForgingChannel>(inner(peer), &forge_no_session,
                                                       topo_.job_id(), topo_.root().index);
    };
  }

  void loop() {
    auto next_beat = Clock::now();
    while (!stop_) {
      if (!serving) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      transport::Incoming in;
      if (link_.recv(&in, std::chrono::milliseconds(20))) on_frame(in);
      if (!mute_ && !silent && Clock::now() >= next_beat) {
        next_beat = Clock::now() + std::chrono::milliseconds(100);
        for (const std::string& child : joined_) send(child, wire::MsgType::kHeartbeat, 0);
      }
    }
  }

  void on_frame(const transport::Incoming& in) {
    const wire::ParsedFrame f = wire::parse_frame(in.data(), in.frame_size);
    if (!f.ok()) return;
    if (f.header.type != wire::MsgType::kHello) {
      if (on_other && !mute_) on_other(*this, in.peer, f);
      return;
    }
    hellos_ += 1;
    const bool replica = (f.header.flags & wire::kFlagNeedReplica) != 0;
    if (replica) replica_requests_ += 1;
    if (mute_) return;
    if (replica) {
      send(in.peer, wire::MsgType::kCheckpoint, wire::kFlagNoReplica);
    } else {
      joined_.insert(in.peer);
      if (on_hello) on_hello(*this, in.peer, f);
    }
  }

  void send(const std::string& child, wire::MsgType type, uint8_t flags) {
    wire::FrameHeader h = header(type);
    h.flags = flags;
    send(child, h, {});
  }

  const Topology& topo_;
  node::NodeConfig config_;
  node::NodeSecurity security_;
  std::unique_ptr<transport::Transport> transport_;
  transport::ChildrenLink link_;
  const bool mute_;
  std::set<std::string> joined_;  // the loop thread's
  std::atomic<bool> stop_{false};
  std::atomic<int> hellos_{0}, replica_requests_{0};
  std::thread thread_;  // last: it runs over the members above
};

// What a live root answers the hello of a child that holds the model
// already: a welcome to round 0 that changes nothing (for on_hello).
inline void welcome_unchanged(FakeRoot& r, const std::string& child, const wire::ParsedFrame& f,
                              uint64_t elements) {
  wire::HelloPayload hello;
  if (!wire::decode_hello(f.payload, f.payload_size, &hello)) return;
  wire::FrameHeader h = r.header(wire::MsgType::kWelcome);
  h.flags = wire::kFlagNoChange;
  h.total_elements = elements;
  r.send(child, h, std::vector<uint8_t>(hello.model_digest.begin(), hello.model_digest.end()));
}

// A live root on `topo`'s root endpoint, serving: it welcomes each child
// that holds its model of `elements` already (welcome_unchanged) and
// heartbeats it.
inline std::unique_ptr<FakeRoot> serving_root(const Topology& topo, uint64_t elements) {
  auto root = std::make_unique<FakeRoot>(topo, topo.root().endpoint, /*mute=*/false);
  root->on_hello = [elements](FakeRoot& r, const std::string& child, const wire::ParsedFrame& f) {
    welcome_unchanged(r, child, f, elements);
  };
  root->serving = true;
  return root;
}

// A small tree over ipc:// sockets in `dir`: root (with a standby when
// asked) -> site-0, or root -> region-0 -> site-0; heartbeats every 100 ms
// and a timeout of 1 s unless given.
struct IpcTree {
  std::string job = "ipc-tree";
  uint64_t rounds = 1;
  bool standby = false;
  bool region = false;
  uint64_t chunk_bytes = 1 << 20;
  double heartbeat_s = 0.1;
  double heartbeat_timeout_s = 1;
};
inline Topology ipc_tree(const std::filesystem::path& dir, const IpcTree& t) {
  FederationSpec f;
  f.rounds = t.rounds;
  f.chunk_bytes = t.chunk_bytes;
  f.heartbeat_s = t.heartbeat_s;
  f.heartbeat_timeout_s = t.heartbeat_timeout_s;
  NodeSpec root;
  root.id = "root";
  root.role = Role::kRoot;
  root.endpoint = "ipc://" + (dir / "root.sock").string();
  if (t.standby) root.standby_endpoint = "ipc://" + (dir / "standby.sock").string();
  std::vector<NodeSpec> nodes = {root};
  if (t.region) {
    NodeSpec r;
    r.id = "region-0";
    r.role = Role::kRegion;
    r.parent = "root";
    r.endpoint = "ipc://" + (dir / "region.sock").string();
    nodes.push_back(r);
  }
  NodeSpec site;
  site.id = "site-0";
  site.role = Role::kSite;
  site.parent = t.region ? "region-0" : "root";
  nodes.push_back(site);
  return Topology::build(t.job, f, nodes);
}

// root, with a standby, -> site-0.
inline Topology root_with_standby(const std::filesystem::path& dir) {
  IpcTree t;
  t.job = "standby-failover";
  t.standby = true;
  return ipc_tree(dir, t);
}

}  // namespace fedwan::testing
