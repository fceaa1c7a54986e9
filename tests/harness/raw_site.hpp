// A site driven frame by frame from a test, able to misbehave: it holds a
// real link (mutual TLS with its own credentials, or plaintext) but sends
// whatever frames the test builds, and can replay or tamper with sealed
// bytes.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/security.hpp"
#include "fedwan/topology.hpp"
#include "node/node_frames.hpp"
#include "security/authorization.hpp"
#include "security/tls_session.hpp"
#include "transport/links.hpp"
#include "transport/secure_channel.hpp"
#include "wire/frame.hpp"

namespace fedwan::testing {

// Client-side mutual TLS for a test peer acting as node `self_id`, with the
// credentials bundle in `bundle_dir`. Unlike a real node it does not refuse
// to start with an expired, revoked or foreign certificate: tests use it to
// play the attacker. With check_parent false it accepts any parent the CA
// vouches for (so a test can reach an aggregator's own checks).
inline transport::SecurityFactory test_client_security(const Topology& topo,
                                                       const std::string& self_id,
                                                       const std::string& bundle_dir,
                                                       bool check_parent = true,
                                                       const std::string& cipher = "aes-256-gcm") {
  transport::SecureChannelConfig c;
  c.tls = std::make_shared<security::TlsContext>(bundle_dir, /*verify_own=*/false);
  c.cipher = security::aead_by_name(cipher);
  c.job_id = topo.job_id();
  c.self_index = topo.node(self_id).index;
  const NodeSpec* self = &topo.node(self_id);
  c.authorize = [&topo, self, check_parent](const security::NodeIdentity& cert,
                                            const std::string&) -> std::optional<std::string> {
    if (!check_parent) return std::nullopt;
    return security::authorize_parent(topo, *self, cert);
  };
  return [c](const std::string& peer) {
    return std::make_unique<transport::SecureChannel>(c, /*is_client=*/true, peer);
  };
}

// Server-side mutual TLS for a test aggregator acting as node `self_id` with
// the bundle in `bundle_dir`: it accepts any child the CA vouches for, so a
// test can play an aggregator that would take a site it should not.
inline transport::SecurityFactory test_server_security(const Topology& topo,
                                                       const std::string& self_id,
                                                       const std::string& bundle_dir) {
  transport::SecureChannelConfig c;
  c.tls = std::make_shared<security::TlsContext>(bundle_dir, /*verify_own=*/false);
  c.job_id = topo.job_id();
  c.self_index = topo.node(self_id).index;
  c.authorize = [](const security::NodeIdentity&, const std::string&) {
    return std::optional<std::string>();
  };
  return [c](const std::string& peer) {
    return std::make_unique<transport::SecureChannel>(c, /*is_client=*/false, peer);
  };
}

class RawSite {
 public:
  // Connects to `endpoint` (default: the parent's) under routing id `id`.
  RawSite(const Topology& topo, const std::string& id, transport::SecurityFactory security,
          std::string endpoint = "")
      : topo_(topo),
        self_(topo.node(id)),
        endpoint_(endpoint.empty() ? topo.node(self_.parent_index).endpoint : endpoint),
        transport_(transport::make_transport(endpoint_)),
        link_(*transport_, endpoint_, id, quick_close(), std::move(security)) {}

  static transport::LinkOptions quick_close() {
    transport::LinkOptions o;
    o.linger_ms = 0;
    return o;
  }

  transport::ParentLink& link() { return link_; }
  const NodeSpec& node() const { return self_; }

  // Seals (when secure) and sends.
  void send(const std::vector<uint8_t>& frame) { link_.send(frame, std::chrono::seconds(10)); }
  // The bytes send() would put on the wire, without sending them.
  std::vector<uint8_t> seal(std::vector<uint8_t> frame) {
    link_.wait_established(std::chrono::seconds(10));
    link_.security().seal(frame);
    return frame;
  }
  // Puts bytes on the wire as they are.
  void send_raw(std::vector<uint8_t> bytes) {
    link_.send_sealed(std::move(bytes), std::chrono::seconds(10));
  }

  // Next frame from the parent within `timeout`; nullopt-like !ok() frame
  // with detail "timeout" when none came.
  wire::ParsedFrame recv(std::vector<uint8_t>* storage,
                         std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    transport::Incoming in;
    if (!link_.recv(&in, timeout)) {
      wire::ParsedFrame none;
      none.reject = wire::RejectReason::kTooShort;
      none.detail = "timeout";
      return none;
    }
    storage->assign(in.data(), in.data() + in.frame_size);
    return wire::parse_frame(storage->data(), storage->size());
  }

  std::vector<uint8_t> hello_frame(const std::vector<float>& model) const {
    wire::HelloPayload h;
    h.node_id = self_.id;
    h.topology_digest = topo_.digest();
    h.model_digest = sha256(model.data(), model.size() * sizeof(float));
    wire::FrameHeader hd = node::node_header(topo_, self_.index, wire::MsgType::kHello, 0);
    hd.total_elements = model.size();
    return node::make_frame(hd, wire::encode_hello(h));
  }
  void hello(const std::vector<float>& model) { send(hello_frame(model)); }

  // An fp32 delta chunk of `value`s; claimed_n != n makes it inconsistent.
  // `weight` < 0: the node's topology weight in the header.
  std::vector<uint8_t> delta(uint64_t round, uint32_t chunk, uint32_t count, uint32_t n,
                             uint32_t claimed_n, uint64_t total, float value = 0.0f,
                             double weight = -1) const {
    const Codec& fp32 = codec_by_name("fp32");
    std::vector<float> values(n, value);
    std::vector<uint8_t> payload(fp32.encoded_size(n));
    fp32.encode(values.data(), n, nullptr, payload.data());
    wire::FrameHeader h = node::node_header(topo_, self_.index, wire::MsgType::kDelta, round);
    h.codec = static_cast<uint8_t>(CodecId::kFp32);
    h.chunk_index = chunk;
    h.chunk_count = count;
    h.element_count = claimed_n;
    h.total_elements = total;
    h.weight = weight < 0 ? self_.weight : weight;
    std::vector<uint8_t> f = node::make_frame(h, payload);
    if (claimed_n != n) {
      // Re-encode the header so the payload length stays self-consistent.
      h.payload_length = static_cast<uint32_t>(fp32.encoded_size(claimed_n));
      payload.resize(h.payload_length);
      f = wire::encode_frame(h, payload.data(), payload.size());
    }
    return f;
  }

 private:
  const Topology& topo_;
  const NodeSpec& self_;
  std::string endpoint_;
  std::unique_ptr<transport::Transport> transport_;
  transport::ParentLink link_;
};

// The next frame of `type` from the parent (others are skipped), or the
// first refused one (a timeout among them).
inline wire::ParsedFrame await_type(RawSite& s, std::vector<uint8_t>* buf, wire::MsgType type) {
  for (;;) {
    wire::ParsedFrame f = s.recv(buf);
    if (!f.ok() || f.header.type == type) return f;
  }
}

}  // namespace fedwan::testing
