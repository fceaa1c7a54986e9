// Making a replica image (replica_image.hpp): each section encoded while
// write_checkpoint writes it, from the node's own arrays. Reading one back
// is replica_decode.cpp.
#include "checkpoint/replica_image.hpp"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_meta.hpp"
#include "checkpoint/replica_format.hpp"
#include "codec/half.hpp"
#include "common/background_sha256.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"

namespace fedwan::checkpoint {
namespace {

using replica::kBf16;
using replica::kBf16Held;
using replica::kBlockFloats;
using replica::kMeta;
using replica::kXor;
using replica::kZstd;

constexpr int kLevel = 1;  // fast; the model's bits barely compress further

struct CCtxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};

using Sink = CheckpointSection::Sink;

// One zstd frame of `total` bytes fed in pieces, handed to `sink` as it is
// made.
class Compressor {
 public:
  // kPlane: bytes that are mostly literals for zstd (a bf16 plane of
  // sign and exponent bits): its fast strategy with a small hash table and
  // 7-byte matches spends less time looking for the few repeats there
  // are. On a site's residual plane at 100M parameters (100 MB): 507 MB/s
  // and 37.6 MB against level 1's 296 MB/s and 39.1 MB.
  enum class Tuning { kLevel1, kPlane };
  Compressor(size_t total, const Sink& sink, Tuning tuning = Tuning::kLevel1)
      : ctx_(ZSTD_createCCtx()), sink_(sink), out_(ZSTD_CStreamOutSize()) {
    if (!ctx_) throw Error("replica image: zstd cannot allocate a compression context");
    check(ZSTD_CCtx_setParameter(ctx_.get(), ZSTD_c_compressionLevel, kLevel));
    if (tuning == Tuning::kPlane) {
      check(ZSTD_CCtx_setParameter(ctx_.get(), ZSTD_c_strategy, ZSTD_fast));
      check(ZSTD_CCtx_setParameter(ctx_.get(), ZSTD_c_windowLog, 17));
      check(ZSTD_CCtx_setParameter(ctx_.get(), ZSTD_c_hashLog, 9));
      check(ZSTD_CCtx_setParameter(ctx_.get(), ZSTD_c_minMatch, 7));
    }
    check(ZSTD_CCtx_setParameter(ctx_.get(), ZSTD_c_checksumFlag, 1));  // damage is an error
    check(ZSTD_CCtx_setPledgedSrcSize(ctx_.get(), total));
  }
  void feed(const void* data, size_t n, bool last) {
    ZSTD_inBuffer in{data, n, 0};
    const ZSTD_EndDirective mode = last ? ZSTD_e_end : ZSTD_e_continue;
    for (;;) {
      ZSTD_outBuffer o{out_.data(), out_.size(), 0};
      const size_t left = check(ZSTD_compressStream2(ctx_.get(), &o, &in, mode));
      if (o.pos > 0) sink_(out_.data(), o.pos);
      if (last ? left == 0 : in.pos == in.size) return;
    }
  }

 private:
  static size_t check(size_t r) {
    if (ZSTD_isError(r)) throw Error(std::string("replica image: zstd: ") + ZSTD_getErrorName(r));
    return r;
  }
  std::unique_ptr<ZSTD_CCtx, CCtxFree> ctx_;
  const Sink& sink_;
  std::vector<uint8_t> out_;
};

const float* floats_view(const CheckpointSection& s, size_t n, const std::string& base) {
  if (s.size() != n * sizeof(float)) {
    throw ConfigError("replica image: section '" + s.name + "' is not the size of '" + base + "'");
  }
  return reinterpret_cast<const float*>(s.data());
}

void xor_compressed(const float* values, const float* base, size_t n, const Sink& sink) {
  Compressor z(n * sizeof(float), sink);
  std::vector<uint32_t> block(std::min(n, kBlockFloats));
  for (size_t at = 0; at < n || n == 0; at += kBlockFloats) {
    const size_t k = std::min(kBlockFloats, n - at);
    for (size_t i = 0; i < k; ++i) {
      uint32_t a = 0, b = 0;
      std::memcpy(&a, values + at + i, 4);
      std::memcpy(&b, base + at + i, 4);
      block[i] = a ^ b;
    }
    z.feed(block.data(), k * sizeof(uint32_t), at + k >= n);
    if (n == 0) break;
  }
}

// n bf16 values, split into byte planes: the high bytes (sign, exponent, a
// mantissa bit), whose few values zstd's entropy coding shrinks,
// compressed; then the low bytes, near random, as they are. `halves`
// writes values [at, at + k) as little-endian bf16 to its `out`; it is
// called twice per block (once per plane), so nothing of the planes is
// held beyond a block.
void bf16_planes(size_t n, const std::function<void(size_t at, size_t k, uint8_t* out)>& halves,
                 const Sink& sink) {
  std::vector<uint8_t> block(std::min(n, kBlockFloats) * sizeof(uint16_t));
  std::vector<uint8_t> plane(std::min(n, kBlockFloats));
  Compressor z(n, sink, Compressor::Tuning::kPlane);
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t at = 0; at < n || n == 0; at += kBlockFloats) {
      const size_t k = std::min(kBlockFloats, n - at);
      halves(at, k, block.data());
      for (size_t i = 0; i < k; ++i) plane[i] = block[2 * i + (pass == 0 ? 1 : 0)];
      if (pass == 0) {
        z.feed(plane.data(), k, at + k >= n);
      } else if (k > 0) {
        sink(plane.data(), k);
      }
      if (n == 0) break;
    }
  }
}

void compressed(const uint8_t* data, size_t n, const Sink& sink) {
  Compressor z(n, sink);
  z.feed(data, n, true);
}

// The base's digest, begun on a helper thread when the image is made and
// taken when its meta is written (or materialized: then kept).
class BaseHash {
 public:
  BaseHash(const uint8_t* data, size_t size) : hashing_({{data, size}}, 1) {}
  const Sha256Digest& digest() {
    if (!digest_) digest_ = hashing_.wait().at(0);
    return *digest_;
  }

 private:
  BackgroundSha256 hashing_;
  std::optional<Sha256Digest> digest_;
};

bool listed(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

Checkpoint make_replica_image(const Checkpoint& c, const ReplicaPlan& plan,
                              const std::array<uint8_t, 32>* base_sha256) {
  const CheckpointSection* base = c.find(plan.base);
  if (base == nullptr || base->size() % sizeof(float) != 0) {
    throw ConfigError("replica image: the checkpoint has no fp32 section '" + plan.base + "'");
  }
  const size_t n = base->size() / sizeof(float);
  const auto* base_f = reinterpret_cast<const float*>(base->data());
  Checkpoint image;
  image.round = c.round;
  image.topology_digest = c.topology_digest;
  image.node_id = c.node_id;
  nlohmann::json sections = nlohmann::json::array();
  for (const CheckpointSection& s : c.sections) {
    if (s.name == plan.base || s.name == kMeta) continue;
    CheckpointSection out = replica::plain_section(s.name, {});
    const char* encoding = kZstd;
    // The producers read the section's bytes (a view of the node's model,
    // or c's own) while write_checkpoint writes the image.
    const uint8_t* data = s.data();
    const size_t size = s.size();
    if (listed(plan.xor_sections, s.name)) {
      const float* values = floats_view(s, n, plan.base);
      out.produce = [values, base_f, n](const Sink& sink) {
        xor_compressed(values, base_f, n, sink);
      };
      encoding = kXor;
    } else if (listed(plan.bf16_sections, s.name)) {
      if (size % sizeof(float) != 0) {
        throw ConfigError("replica image: section '" + s.name + "' is not fp32");
      }
      const auto* values = reinterpret_cast<const float*>(data);
      out.produce = [values, k = size / sizeof(float)](const Sink& sink) {
        const kernels::HalfKernels& k16 = kernels::half_kernels();  // AVX2 where the CPU has it
        bf16_planes(
            k,
            [&](size_t at, size_t m, uint8_t* o) { k16.bf16_encode(values + at, nullptr, m, o); },
            sink);
      };
      encoding = kBf16;
    } else if (listed(plan.bf16_held_sections, s.name)) {
      if (size % sizeof(uint16_t) != 0) {
        throw ConfigError("replica image: section '" + s.name + "' is not bf16");
      }
      out.produce = [data, k = size / sizeof(uint16_t)](const Sink& sink) {
        bf16_planes(
            k,
            [&](size_t at, size_t m, uint8_t* o) {
              if (m > 0) std::memcpy(o, data + 2 * at, 2 * m);  // none: both may be null
            },
            sink);
      };
      encoding = kBf16Held;
    } else {
      out.produce = [data, size](const Sink& sink) { compressed(data, size, sink); };
    }
    sections.push_back({{"name", s.name}, {"encoding", encoding}, {"bytes", size}});
    image.sections.push_back(std::move(out));
  }
  nlohmann::json meta = checkpoint_meta(c);
  meta["replica"] = {{"base", plan.base}, {"sections", std::move(sections)}};
  if (base_sha256 != nullptr || base->size() < BackgroundSha256::kWorthFrom) {
    const Sha256Digest digest =
        base_sha256 != nullptr ? *base_sha256 : sha256(base->data(), base->size());
    meta["replica"]["base_sha256"] = to_hex(digest.data(), digest.size());
    image.sections.push_back(replica::meta_section(meta));
    return image;
  }
  // The base hashed on a helper thread while the sections before the meta
  // (the last) are encoded and written: a site's image every round does not
  // wait for the anchor's SHA-256 (0.2 s at 100M parameters) on its own.
  auto base_hash = std::make_shared<BaseHash>(base->data(), base->size());
  CheckpointSection m = replica::plain_section(kMeta, {});
  m.produce = [meta = std::move(meta), base_hash](const Sink& sink) {
    nlohmann::json full = meta;
    const Sha256Digest& digest = base_hash->digest();
    full["replica"]["base_sha256"] = to_hex(digest.data(), digest.size());
    const std::string bytes = full.dump();
    sink(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  };
  image.sections.push_back(std::move(m));
  return image;
}

}  // namespace fedwan::checkpoint
