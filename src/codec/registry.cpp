#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "codec/bf16_codec.hpp"
#include "codec/fp16_codec.hpp"
#include "codec/fp32_codec.hpp"
#include "codec/int8_codec.hpp"
#include "common/stream_copy.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"

namespace fedwan {
namespace {

// Codecs are never removed, so a pointer handed out stays valid for the life
// of the process. Wire-id lookups (one per received chunk, from many threads)
// are a lock-free load; name lookups and registration take the mutex.
class CodecRegistry {
 public:
  CodecRegistry() {
    add(std::make_unique<Fp32Codec>());
    add(std::make_unique<Fp16Codec>());
    add(std::make_unique<Bf16Codec>());
    add(std::make_unique<Int8Codec>());
  }

  void add(std::unique_ptr<Codec> codec) {
    if (!codec) throw ConfigError("register_codec: the codec is null");
    const std::string name(codec->name());
    const uint8_t id = static_cast<uint8_t>(codec->id());
    if (name.empty()) throw ConfigError("register_codec: a codec needs a non-empty name");
    if (id == 0) {
      throw ConfigError("register_codec: codec '" + name +
                        "' uses wire id 0, which the frame format reserves for 'no codec'");
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& c : codecs_) {
      if (c->name() == name) {
        throw ConfigError("register_codec: a codec named '" + name +
                          "' is already registered; pick another name");
      }
    }
    if (const Codec* other = by_id_[id].load(std::memory_order_acquire)) {
      throw ConfigError("register_codec: wire id " + std::to_string(id) + " of codec '" + name +
                        "' is already taken by '" + std::string(other->name()) +
                        "'; wire ids are never reused");
    }
    by_id_[id].store(codec.get(), std::memory_order_release);
    codecs_.push_back(std::move(codec));
  }

  const Codec* by_name(std::string_view name) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& c : codecs_) {
      if (c->name() == name) return c.get();
    }
    return nullptr;
  }

  const Codec* by_wire_id(uint8_t id) const { return by_id_[id].load(std::memory_order_acquire); }

  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    out.reserve(codecs_.size());
    for (const auto& c : codecs_) out.emplace_back(c->name());
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Codec>> codecs_;  // registration order
  // By wire id; null where no codec has registered it.
  std::array<std::atomic<const Codec*>, 256> by_id_{};
};

CodecRegistry& registry() {
  static CodecRegistry r;
  return r;
}

// Builds the registry while the library loads, so the built-ins exist before
// main and before any thread can race on the first lookup.
[[maybe_unused]] const bool kBuiltinsRegistered = (registry(), true);

}  // namespace

const Codec& codec_by_name(std::string_view name) {
  if (const Codec* c = registry().by_name(name)) return *c;
  std::string known;
  for (const auto& n : registry().names()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError("unknown codec '" + std::string(name) + "'; known codecs: " + known);
}

const Codec* codec_by_id(CodecId id) { return registry().by_wire_id(static_cast<uint8_t>(id)); }

const Codec* codec_by_wire_id(uint8_t id) { return registry().by_wire_id(id); }

std::vector<std::string> codec_names() { return registry().names(); }

void register_codec(std::unique_ptr<Codec> codec) { registry().add(std::move(codec)); }

void Codec::decode_add(const uint8_t* in, size_t n, const float* base, float* out) const {
  if (out != base && n > 0) std::memcpy(out, base, n * sizeof(float));
  decode_accumulate(in, n, 1.0f, out);
}

void Codec::decode_add_copy(const uint8_t* in, size_t n, float* acc, float* copy) const {
  decode_add(in, n, acc, acc);
  stream_copy(copy, acc, n);
}

}  // namespace fedwan
