// fedwan-dishonest-site: the `fedwan` tool with one change, for robustness
// experiments with real processes. The updates its site sends are rewritten
// after the site's own encoder and checks, just before they are sealed, so
// they reach the parent as what a dishonest but authenticated site would
// send: valid frames on its own mutual-TLS session, values of its choosing.
//
//   FEDWAN_ATTACK=KIND fedwan-dishonest-site site --topology ... --node site-3 ...
//   fedwan demo --node-binary site-3=fedwan-dishonest-site   (FEDWAN_ATTACK set)
//
// KIND: none, scale_1e3, scale_1e6, sign_flip_x10, sign_flip_x3, one_nan,
// one_inf (written as raw codec bytes, not through the codec, which would
// refuse them), one_huge (one value of 3e38, which every codec carries: fp16
// and int8 in their block scale), noise_100x (Gaussian noise of 100 x the
// chunk's norm), replay_round_0 (every round's chunks carry the first
// round's bytes). Only delta frames change; every other frame and
// every other program path is the product's.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.hpp"
#include "codec/fp16_codec.hpp"
#include "codec/int8_codec.hpp"
#include "fedwan/codec.hpp"
#include "node/node_security.hpp"
#include "transport/channel_security.hpp"
#include "wire/frame.hpp"

namespace {

using fedwan::CodecId;
using fedwan::transport::ChannelSecurity;
using fedwan::transport::SecurityReplies;

enum class Attack {
  kNone,
  kScale1e3,
  kScale1e6,
  kSignFlip10,
  kSignFlip3,
  kOneNaN,
  kOneInf,
  kOneHuge,
  kNoise100,
  kReplay
};

const std::map<std::string, Attack>& attacks() {
  static const std::map<std::string, Attack> m = {{"none", Attack::kNone},
                                                  {"scale_1e3", Attack::kScale1e3},
                                                  {"scale_1e6", Attack::kScale1e6},
                                                  {"sign_flip_x10", Attack::kSignFlip10},
                                                  {"sign_flip_x3", Attack::kSignFlip3},
                                                  {"one_nan", Attack::kOneNaN},
                                                  {"one_inf", Attack::kOneInf},
                                                  {"one_huge", Attack::kOneHuge},
                                                  {"noise_100x", Attack::kNoise100},
                                                  {"replay_round_0", Attack::kReplay}};
  return m;
}

// Writes a NaN or an infinity as raw bytes where element i of an encoded
// chunk of n elements lives: the element itself (fp32, bf16, and fp16's
// halves after its block scales), or int8's block scale.
void write_non_finite(CodecId codec, bool nan, uint8_t* payload, uint32_t n, uint32_t i) {
  const uint32_t f32 = nan ? 0x7FC00000u : 0x7F800000u;
  switch (codec) {
    case CodecId::kFp32: std::memcpy(payload + 4 * size_t{i}, &f32, 4); return;
    case CodecId::kBf16: {
      const uint16_t v = nan ? 0x7FC0 : 0x7F80;
      std::memcpy(payload + 2 * size_t{i}, &v, 2);
      return;
    }
    case CodecId::kFp16: {
      const uint16_t v = nan ? 0x7E00 : 0x7C00;
      const size_t scales = fedwan::Fp16Codec::kScaleBytes * fedwan::Fp16Codec::blocks(n);
      std::memcpy(payload + scales + 2 * size_t{i}, &v, 2);
      return;
    }
    case CodecId::kInt8:
      std::memcpy(payload + fedwan::Int8Codec::kScaleBytes * (i / fedwan::Int8Codec::kBlock), &f32,
                  4);
      return;
  }
}

// Rewrites delta frames; one instance shared by every connection of the
// process (a striped link, a reconnect), since the replay spans rounds.
class Tamper {
 public:
  explicit Tamper(Attack a) : attack_(a) {}

  void rewrite(std::vector<uint8_t>& frame) {
    if (attack_ == Attack::kNone) return;
    const fedwan::wire::ParsedFrame p = fedwan::wire::parse_frame(frame.data(), frame.size());
    if (!p.ok() || p.header.type != fedwan::wire::MsgType::kDelta || p.payload_size == 0) return;
    const auto codec_id = static_cast<CodecId>(p.header.codec);
    const fedwan::Codec* codec = fedwan::codec_by_id(codec_id);
    if (codec == nullptr) return;
    uint8_t* payload = frame.data() + (p.payload - frame.data());
    const size_t bytes = p.payload_size;
    const uint32_t n = p.header.element_count;
    std::lock_guard<std::mutex> lock(mu_);
    switch (attack_) {
      case Attack::kOneNaN:
      case Attack::kOneInf:
        write_non_finite(codec_id, attack_ == Attack::kOneNaN, payload, n, n / 2);
        return;
      case Attack::kReplay: {
        std::vector<uint8_t>& first = first_[p.header.chunk_index];
        if (first.empty()) {
          first.assign(payload, payload + bytes);
          first_round_ = p.header.round;
        } else if (p.header.round != first_round_ && first.size() == bytes) {
          std::memcpy(payload, first.data(), bytes);
        }
        return;
      }
      default: break;
    }
    std::vector<float> x(n);
    codec->decode(payload, n, x.data());
    switch (attack_) {
      case Attack::kScale1e3: scale(x, 1e3f); break;
      case Attack::kScale1e6: scale(x, 1e6f); break;
      case Attack::kSignFlip10: scale(x, -10.0f); break;
      case Attack::kSignFlip3: scale(x, -3.0f); break;
      // The codec's own scale carries it (fp16 and int8 scale per block).
      case Attack::kOneHuge: x[n / 2] = 3e38f; break;
      case Attack::kNoise100: {
        double sq = 0;
        for (float v : x) sq += static_cast<double>(v) * v;
        std::normal_distribution<float> noise(
            0.0f, static_cast<float>(100 * std::sqrt(sq / static_cast<double>(n))));
        for (float& v : x) v += noise(rng_);
        break;
      }
      default: break;
    }
    // Encoded again without error feedback (a dishonest site keeps none).
    codec->encode(x.data(), n, nullptr, payload);
  }

 private:
  static void scale(std::vector<float>& x, float k) {
    for (float& v : x) v *= k;
  }
  Attack attack_;
  std::mutex mu_;
  std::mt19937 rng_{20261129};
  uint64_t first_round_ = 0;
  std::map<uint32_t, std::vector<uint8_t>> first_;
};

// The parent link's security mechanism, unchanged except that delta frames
// are rewritten before they are sealed. It offers no off-thread sealer, so
// every frame passes through seal() here.
class TamperingChannel final : public ChannelSecurity {
 public:
  TamperingChannel(std::unique_ptr<ChannelSecurity> inner, std::shared_ptr<Tamper> tamper)
      : inner_(std::move(inner)), tamper_(std::move(tamper)) {}
  std::string_view name() const override { return inner_->name(); }
  bool established() const override { return inner_->established(); }
  const std::string& failure() const override { return inner_->failure(); }
  bool failure_is_final() const override { return inner_->failure_is_final(); }
  void start(SecurityReplies* out) override { inner_->start(out); }
  void seal(std::vector<uint8_t>& bytes) override {
    tamper_->rewrite(bytes);
    inner_->seal(bytes);
  }
  Inbound receive(uint8_t* data, size_t size, size_t* frame_size, std::string* why,
                  SecurityReplies* out) override {
    return inner_->receive(data, size, frame_size, why, out);
  }
  Inbound sealed_before_any_session(std::string reason, uint64_t bytes, std::string* why,
                                    SecurityReplies* out) override {
    return inner_->sealed_before_any_session(std::move(reason), bytes, why, out);
  }
  std::optional<Order> last_order() const override { return inner_->last_order(); }
  uint64_t key_agreements() const override { return inner_->key_agreements(); }
  bool handshaking() const override { return inner_->handshaking(); }
  std::optional<std::chrono::steady_clock::time_point> peer_without_session() const override {
    return inner_->peer_without_session();
  }
  void abandon_handshake() override { inner_->abandon_handshake(); }

 private:
  std::unique_ptr<ChannelSecurity> inner_;
  std::shared_ptr<Tamper> tamper_;
};

}  // namespace

int main(int argc, char** argv) {
  const char* kind = std::getenv("FEDWAN_ATTACK");
  const std::string name = kind == nullptr ? "none" : kind;
  const auto found = attacks().find(name);
  if (found == attacks().end()) {
    std::cerr << "fedwan-dishonest-site: unknown FEDWAN_ATTACK '" << name << "'; one of:";
    for (const auto& [k, v] : attacks()) std::cerr << " " << k;
    std::cerr << "\n";
    return 2;
  }
  auto tamper = std::make_shared<Tamper>(found->second);
  fedwan::node::set_parent_channel_wrapper([tamper](std::unique_ptr<ChannelSecurity> inner) {
    return std::make_unique<TamperingChannel>(std::move(inner), tamper);
  });
  return fedwan::cli::run(argc, argv);
}
