// SiteCore: the site role of the round protocol over a caller-owned flat
// fp32 buffer. join() says hello and loads the federation's anchor; sync()
// streams the pseudo-gradient (anchor - params) chunk by chunk with error
// feedback, then applies the next anchor as its chunks arrive.
#include "fedwan/site_core.hpp"

#include <algorithm>
#include <cstring>
#include <optional>

#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include <nlohmann/json.hpp>

#include "runtime/node_frames.hpp"
#include "runtime/node_security.hpp"
#include "security/sealing_pipeline.hpp"
#include "tensor/chunk_plan.hpp"
#include "transport/links.hpp"
#include "transport/secure_channel.hpp"

namespace fedwan {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

class SiteCore::Impl {
 public:
  Impl(SiteOptions options, float* params, size_t n);
  SyncResult join();
  SyncResult sync();

  SiteOptions opt;
  const Topology& topo;
  const NodeSpec& self;
  float* params;
  ChunkPlan plan;
  const Codec* codec;
  std::array<uint8_t, 32> initial_digest{};
  std::vector<float> anchor;    // the model the federation agreed on for this round
  std::vector<float> residual;  // error feedback of the deltas sent (lossy codecs)
  uint64_t round = 0;
  bool joined = false;
  bool finished = false;
  Millis round_timeout;

  // Declared before the link: its security layer reports to it.
  std::unique_ptr<runtime::NodeSecurity> security;
  zmq::context_t ctx{1};
  std::unique_ptr<ParentLink> link;

 private:
  // The chunks of one anchor as they arrive (full values, or an update).
  struct AnchorAssembly {
    uint64_t round = 0;
    bool full = false;
    std::vector<bool> got;
    uint32_t received = 0;
    bool done_signalled = false;  // the federation finished instead
  };
  AnchorAssembly expect_anchor(uint64_t round, bool full) const;
  // Applies one frame to the assembly (anchor chunks into `anchor`).
  void on_anchor_frame(const wire::ParsedFrame& f, AnchorAssembly* a);
  bool complete(const AnchorAssembly& a) const {
    return a.done_signalled || a.received == plan.count();
  }
  // Waits until the assembly is complete; then loads the anchor into params.
  // Returns false if the federation finished instead.
  bool finish_anchor(AnchorAssembly* a, SyncResult* res);
  // Tells the parent this site holds the final model, so it may close.
  void confirm_end(SyncResult* res);
  // The next valid frame from the parent within `timeout`, or nullopt.
  std::optional<wire::ParsedFrame> poll_frame(Incoming* in, Millis timeout);
  wire::ParsedFrame next_frame(Incoming* in, Clock::time_point deadline, const char* waiting_for);
};

SiteCore::Impl::Impl(SiteOptions options, float* p, size_t n)
    : opt(std::move(options)),
      topo(opt.topology),
      self(topo.node(opt.node_id)),
      params(p),
      plan(ChunkPlan::from_bytes(n, topo.federation().chunk_bytes)),
      codec(&codec_by_name(topo.federation().codec)) {
  if (self.role != Role::kSite) {
    throw ConfigError("node '" + self.id + "' is a " + role_name(self.role) +
                      ", not a site; run it with `fedwan aggregator`");
  }
  if (params == nullptr) throw ConfigError("site '" + self.id + "': no parameter buffer");
  round_timeout = opt.round_timeout.count() > 0
                      ? opt.round_timeout
                      : Millis(static_cast<int64_t>(topo.federation().round_timeout_s * 1000));
  initial_digest = sha256(params, n * sizeof(float));
  LinkOptions lo;
  lo.window = opt.window;
  lo.max_message_bytes =
      static_cast<int64_t>(wire::kHeaderSize + topo.federation().chunk_bytes + 4096);
  const NodeSpec& parent = topo.node(self.parent_index);
  security = std::make_unique<runtime::NodeSecurity>(opt.security, topo, self);
  link = std::make_unique<ParentLink>(ctx, parent.endpoint, self.id, lo,
                                      security->parent_factory());
}

std::optional<wire::ParsedFrame> SiteCore::Impl::poll_frame(Incoming* in, Millis timeout) {
  wire::FrameLimits limits;
  limits.max_chunk_elements = plan.chunk_elements();
  limits.max_total_elements = plan.total();
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left = std::max(Millis(0), std::chrono::duration_cast<Millis>(
                                              deadline - Clock::now()));
    if (!link->recv(in, left)) return std::nullopt;
    wire::ParsedFrame f = wire::parse_frame(in->data(), in->frame_size, limits);
    if (!f.ok()) {
      log().warn("[site:{}] dropped malformed frame from parent: {} ({})", self.id,
                 wire::reject_reason_name(f.reject), f.detail);
      continue;
    }
    if (f.header.job_id != topo.job_id() || f.header.sender != self.parent_index) {
      log().warn("[site:{}] dropped a frame not from its parent", self.id);
      continue;
    }
    if (f.header.type == wire::MsgType::kReject) {
      throw ProtocolError("site '" + self.id + "' refused by '" +
                          topo.node(self.parent_index).id + "': " +
                          std::string(reinterpret_cast<const char*>(f.payload), f.payload_size));
    }
    return f;
  }
}

wire::ParsedFrame SiteCore::Impl::next_frame(Incoming* in, Clock::time_point deadline,
                                             const char* waiting_for) {
  const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
  std::optional<wire::ParsedFrame> f = left.count() > 0 ? poll_frame(in, left) : std::nullopt;
  if (!f) {
    throw TimeoutError("site '" + self.id + "': no " + waiting_for + " from parent '" +
                       topo.node(self.parent_index).id + "' at " + link->endpoint() +
                       " within " + std::to_string(round_timeout.count() / 1000) +
                       " s (is it running?)");
  }
  return *f;
}

SyncResult SiteCore::Impl::join() {
  if (joined) throw Error("site '" + self.id + "' already joined");
  wire::HelloPayload hello;
  hello.node_id = self.id;
  hello.topology_digest = topo.digest();
  hello.model_digest = initial_digest;
  wire::FrameHeader h = node_header(topo, self.index, wire::MsgType::kHello, 0);
  h.total_elements = plan.total();
  SyncResult res;
  res.bytes_sent += link->send(make_frame(h, wire::encode_hello(hello)), opt.join_timeout);
  const auto deadline = Clock::now() + opt.join_timeout;
  Incoming in;
  for (;;) {
    wire::ParsedFrame f = next_frame(&in, deadline, "welcome");
    res.bytes_received += in.message.size();
    if (f.header.type != wire::MsgType::kWelcome) {
      log().warn("[site:{}] ignored {} while joining", self.id, wire::msg_type_name(f.header.type));
      continue;
    }
    if (f.header.total_elements != plan.total()) {
      throw ProtocolError("site '" + self.id + "': the federation's model has " +
                          std::to_string(f.header.total_elements) + " parameters, ours " +
                          std::to_string(plan.total()));
    }
    round = f.header.round;
    anchor.assign(params, params + plan.total());
    if (!(f.header.flags & wire::kFlagNoChange)) {
      AnchorAssembly a = expect_anchor(round, true);
      if (!finish_anchor(&a, &res)) finished = true;
    }
    break;
  }
  joined = true;
  res.round = round;
  res.finished = finished;
  log().info("[site:{}] joined at round {}", self.id, round);
  return res;
}

SiteCore::Impl::AnchorAssembly SiteCore::Impl::expect_anchor(uint64_t want_round,
                                                            bool full) const {
  AnchorAssembly a;
  a.round = want_round;
  a.full = full;
  a.got.assign(plan.count(), false);
  return a;
}

void SiteCore::Impl::on_anchor_frame(const wire::ParsedFrame& f, AnchorAssembly* a) {
  const wire::FrameHeader& h = f.header;
  if (h.type == wire::MsgType::kDone) {
    a->done_signalled = true;
    return;
  }
  if (h.type != wire::MsgType::kAnchor) {
    log().warn("[site:{}] ignored {} while waiting for the anchor", self.id,
               wire::msg_type_name(h.type));
    return;
  }
  const bool is_full = (h.flags & wire::kFlagFullAnchor) != 0;
  const Codec* c = codec_by_wire_id(h.codec);
  if (h.round != a->round || is_full != a->full || h.total_elements != plan.total() ||
      h.chunk_count != plan.count() || h.element_count != plan.size(h.chunk_index) ||
      a->got[h.chunk_index] || !c->validate(f.payload, f.payload_size, h.element_count)) {
    throw ProtocolError("site '" + self.id + "': parent sent an anchor chunk that does not "
                        "fit (round " + std::to_string(h.round) + ", chunk " +
                        std::to_string(h.chunk_index) + ", " + std::to_string(h.element_count) +
                        " elements); expected round " + std::to_string(a->round));
  }
  float* dst = anchor.data() + plan.offset(h.chunk_index);
  if (is_full) {
    c->decode(f.payload, h.element_count, dst);
  } else {
    c->decode_accumulate(f.payload, h.element_count, 1.0f, dst);
  }
  a->got[h.chunk_index] = true;
  a->received += 1;
}

bool SiteCore::Impl::finish_anchor(AnchorAssembly* a, SyncResult* res) {
  const auto deadline = Clock::now() + round_timeout;
  Incoming in;
  while (!complete(*a)) {
    const std::string what = "anchor for round " + std::to_string(a->round) + " (" +
                             std::to_string(a->received) + " of " +
                             std::to_string(plan.count()) + " chunks in, " +
                             std::to_string(link->counters().frames_received) +
                             " frames received in all)";
    wire::ParsedFrame f = next_frame(&in, deadline, what.c_str());
    res->bytes_received += in.message.size();
    on_anchor_frame(f, a);
  }
  if (a->done_signalled) return false;
  std::memcpy(params, anchor.data(), plan.total() * sizeof(float));
  return true;
}

void SiteCore::Impl::confirm_end(SyncResult* res) {
  try {
    res->bytes_sent +=
        link->send(make_frame(node_header(topo, self.index, wire::MsgType::kDone, round), {}),
                   Millis(2000));
  } catch (const Error& e) {
    // The parent then waits out its bound and finishes anyway.
    log().warn("[site:{}] could not confirm the end to the parent: {}", self.id, e.what());
  }
}

SyncResult SiteCore::Impl::sync() {
  if (!joined) throw Error("site '" + self.id + "': call join() before sync()");
  if (finished) throw Error("site '" + self.id + "': the federation is already finished");
  SyncResult res;
  const bool lossy = codec->id() != CodecId::kFp32;
  if (lossy && residual.empty()) residual.assign(plan.total(), 0.0f);
  std::vector<float> delta(plan.chunk_elements());
  std::vector<uint8_t> payload;
  // Anchor chunk i exists only once every site has sent delta chunk i, so
  // chunks of the next anchor are applied while later deltas still go out:
  // they touch anchor elements whose delta was already computed.
  AnchorAssembly next = expect_anchor(round + 1, false);
  Incoming in;
  const auto drain_anchor = [&] {
    while (!complete(next)) {
      std::optional<wire::ParsedFrame> f = poll_frame(&in, Millis(0));
      if (!f) break;
      res.bytes_received += in.message.size();
      on_anchor_frame(*f, &next);
    }
  };
  // On a secure link, chunk i is encrypted on a worker while chunk i+1 is
  // encoded here, so sealing costs no extra time while the encoder is busy.
  link->wait_established(round_timeout);
  auto* secure = dynamic_cast<SecureChannel*>(&link->security());
  std::optional<security::SealingPipeline> sealing;
  if (secure != nullptr) sealing.emplace(*secure->sealer(), 2);
  const auto send_sealed = [&](size_t keep) {
    std::vector<uint8_t> sealed;
    while (sealing->in_flight() > keep) {
      if (!sealing->next(&sealed, round_timeout)) {
        throw TimeoutError("site '" + self.id + "': sealing a delta chunk timed out");
      }
      res.bytes_sent += link->send_sealed(std::move(sealed), round_timeout);
    }
  };
  Sha256 update_digest;
  uint64_t update_bytes = 0;
  for (uint32_t i = 0; i < plan.count(); ++i) {
    const uint64_t off = plan.offset(i);
    const uint32_t n = plan.size(i);
    for (uint32_t k = 0; k < n; ++k) delta[k] = anchor[off + k] - params[off + k];
    payload.resize(codec->encoded_size(n));
    codec->encode(delta.data(), n, lossy ? residual.data() + off : nullptr, payload.data());
    wire::FrameHeader h = node_header(topo, self.index, wire::MsgType::kDelta, round);
    h.codec = static_cast<uint8_t>(codec->id());
    h.chunk_index = i;
    h.chunk_count = plan.count();
    h.element_count = n;
    h.total_elements = plan.total();
    h.weight = self.weight;
    if (security->auditing()) {
      update_digest.update(payload.data(), payload.size());
      update_bytes += payload.size();
    }
    if (sealing) {
      sealing->submit(make_frame(h, payload));
      send_sealed(1);
    } else {
      res.bytes_sent += link->send(make_frame(h, payload), round_timeout);
    }
    drain_anchor();
  }
  if (sealing) {
    send_sealed(0);
    sealing.reset();
  }
  if (security->auditing()) {
    const Sha256Digest d = update_digest.finish();
    security->audit("update_sent", {{"round", round},
                                    {"parent", topo.node(self.parent_index).id},
                                    {"chunks", plan.count()},
                                    {"bytes", update_bytes},
                                    {"sha256", to_hex(d.data(), d.size())}});
  }
  if (finish_anchor(&next, &res)) {
    round += 1;
    if (round >= topo.federation().rounds) finished = true;
  } else {
    finished = true;
  }
  if (finished) confirm_end(&res);
  security->audit_sync();
  res.round = round;
  res.finished = finished;
  return res;
}

SiteCore::SiteCore(SiteOptions options, float* params, size_t n)
    : impl_(std::make_unique<Impl>(std::move(options), params, n)) {}
SiteCore::~SiteCore() = default;
SyncResult SiteCore::join() { return impl_->join(); }
SyncResult SiteCore::sync() { return impl_->sync(); }
uint64_t SiteCore::round() const { return impl_->round; }
bool SiteCore::finished() const { return impl_->finished; }
uint64_t SiteCore::inner_steps() const { return impl_->topo.federation().inner_steps; }
const std::array<uint8_t, 32>& SiteCore::initial_digest() const { return impl_->initial_digest; }

}  // namespace fedwan
