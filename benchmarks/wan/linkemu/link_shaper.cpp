#include "link_shaper.hpp"

#include <algorithm>
#include <cmath>

namespace fedwan::linkemu {
namespace {

constexpr uint64_t kMinQueuePackets = 64;
constexpr uint64_t kFullPacket = 1500;
constexpr uint64_t kUnlimitedQueue = 64ull << 20;

uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

bool probability(double p) { return std::isfinite(p) && p >= 0 && p < 1; }

}  // namespace

uint64_t LinkProfile::effective_queue_bytes() const {
  if (queue_bytes != 0) return queue_bytes;
  if (rate_bps <= 0) return kUnlimitedQueue;
  const double bdp = 2 * delay_s * rate_bps / 8;
  return std::max<uint64_t>(static_cast<uint64_t>(bdp), kMinQueuePackets * kFullPacket);
}

std::string LinkProfile::invalid_reason() const {
  if (!std::isfinite(rate_bps) || rate_bps < 0) return "rate must be >= 0 (0 = unlimited)";
  if (rate_bps > 0 && rate_bps < 8000) return "rate must be at least 8 kbit/s";
  if (!std::isfinite(delay_s) || delay_s < 0 || delay_s > 10) return "delay must be 0 to 10 s";
  if (!std::isfinite(jitter_s) || jitter_s < 0 || jitter_s > delay_s) {
    return "jitter must be between 0 and the delay";
  }
  if (!probability(loss)) return "loss must be a probability in [0, 1)";
  if (!probability(duplicate)) return "duplicate must be a probability in [0, 1)";
  if (!probability(reorder)) return "reorder must be a probability in [0, 1)";
  if (queue_bytes != 0 && queue_bytes < kFullPacket) return "queue must hold one 1500-byte packet";
  return {};
}

Random::Random(uint64_t seed) {
  for (uint64_t& s : s_) s = splitmix(seed);
}

uint64_t Random::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Random::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

LinkDirection::LinkDirection(const LinkProfile& profile, uint64_t seed)
    : profile_(profile),
      queue_limit_(profile.effective_queue_bytes()),
      random_(seed),
      ns_per_byte_(profile.rate_bps > 0 ? 8e9 / profile.rate_bps : 0) {}

uint64_t LinkDirection::backlog_bytes(int64_t now_ns) const {
  if (ns_per_byte_ == 0) return 0;
  const double ahead = busy_until_ns_ - static_cast<double>(now_ns);
  return ahead > 0 ? static_cast<uint64_t>(ahead / ns_per_byte_) : 0;
}

Verdict LinkDirection::admit(int64_t now_ns, uint32_t bytes) {
  Verdict v;
  // Every packet draws the same number of random values whatever happens to
  // it, so one setting's randomness does not shift another's.
  const double u_loss = random_.uniform();
  const double u_jitter = random_.uniform();
  const double u_reorder = random_.uniform();
  const double u_dup = random_.uniform();
  if (u_loss < profile_.loss) {
    v.fate = Verdict::Fate::kLost;
    return v;
  }
  const double now = static_cast<double>(now_ns);
  double leaves = now;  // when its last bit leaves the bottleneck
  if (ns_per_byte_ > 0) {
    if (backlog_bytes(now_ns) + bytes > queue_limit_) {
      v.fate = Verdict::Fate::kQueueFull;
      return v;
    }
    busy_until_ns_ = std::max(busy_until_ns_, now) + ns_per_byte_ * bytes;
    leaves = busy_until_ns_;
  }
  v.reordered = u_reorder < profile_.reorder;
  int64_t at;
  if (v.reordered) {
    at = static_cast<int64_t>(leaves);
  } else {
    const double delay = profile_.delay_s + profile_.jitter_s * (2 * u_jitter - 1);
    at = std::max(static_cast<int64_t>(leaves + delay * 1e9), last_deliver_ns_);
    last_deliver_ns_ = at;
  }
  v.copies = u_dup < profile_.duplicate ? 2 : 1;
  v.deliver_ns[0] = at;
  v.deliver_ns[1] = at;
  return v;
}

}  // namespace fedwan::linkemu
