#include "checkpoint/replica_image.hpp"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_meta.hpp"
#include "codec/half.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"

namespace fedwan::checkpoint {
namespace {

// A section of plain bytes (neither a view nor produced as it is written).
CheckpointSection section(std::string name, std::vector<uint8_t> bytes) {
  CheckpointSection s;
  s.name = std::move(name);
  s.bytes = std::move(bytes);
  return s;
}

constexpr const char* kMeta = kMetaSection;
constexpr const char* kXor = "xor-fp32-zstd";
constexpr const char* kBf16 = "bf16-planes";           // zstd(high bytes), then the low bytes
constexpr const char* kBf16Held = "bf16-held-planes";  // the same of bf16 values, kept as bf16
constexpr const char* kZstd = "zstd";
constexpr int kLevel = 1;                      // fast; the model's bits barely compress further
constexpr size_t kBlockFloats = 1u << 16;      // working buffer: 256 KiB of fp32
constexpr uint64_t kMaxRawBytes = 1ull << 40;  // a section no node could hold

struct CCtxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxFree {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
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

// Decompresses one zstd frame (`data`, `size` bytes, of section `name`)
// that must hold exactly n bytes, into `out` when `take` is empty, else a
// working block at a time handed to take(at, block, k).
using TakeBlock = std::function<void(size_t at, const uint8_t* block, size_t k)>;
// NOLINTNEXTLINE(readability-non-const-parameter): zstd writes through `out`
void decompress(const std::string& name, const uint8_t* data, size_t size, uint8_t* out, size_t n,
                const TakeBlock& take = nullptr) {
  const std::string what = "replica image section '" + name + "': ";
  const unsigned long long declared = ZSTD_getFrameContentSize(data, size);
  if (declared != n) throw CryptoError(what + "its compressed size does not match the meta");
  std::unique_ptr<ZSTD_DCtx, DCtxFree> ctx(ZSTD_createDCtx());
  if (!ctx) throw Error("replica image: zstd cannot allocate a decompression context");
  std::vector<uint8_t> block(take ? std::min(n, kBlockFloats * sizeof(float)) : 0);
  ZSTD_inBuffer in{data, size, 0};
  ZSTD_outBuffer o{take ? block.data() : out, take ? block.size() : n, 0};
  size_t done = 0;  // bytes handed to `take` before this block
  const auto hand = [&] {
    if (o.pos > 0) take(done, block.data(), o.pos);
    done += o.pos;
    o.pos = 0;
  };
  for (;;) {
    const size_t in_before = in.pos, out_before = o.pos;
    const size_t r = ZSTD_decompressStream(ctx.get(), &o, &in);
    if (ZSTD_isError(r)) throw CryptoError(what + "zstd: " + ZSTD_getErrorName(r));
    if (r == 0) break;  // frame complete
    if (take && o.pos == o.size && done + o.pos < n) {
      hand();  // a full block: room for the next
      continue;
    }
    if (in.pos == in_before && o.pos == out_before) {
      throw CryptoError(what +
                        (o.pos == o.size ? "it holds more than the meta says" : "it is cut short"));
    }
  }
  if (take) hand();
  if ((take ? done : o.pos) != n || in.pos != in.size) {
    throw CryptoError(what + "it does not hold exactly the bytes the meta says");
  }
}

void decompress(const CheckpointSection& section, uint8_t* out, size_t n) {
  decompress(section.name, section.data(), section.size(), out, n);
}

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

// A section stored as bf16 byte planes (bf16_planes) decoded into
// out[0..bytes): fp32 values, or bf16 when `held`. The high plane is
// decompressed a block at a time, so nothing of it is held whole.
void from_bf16_planes(const CheckpointSection& s, uint64_t bytes, bool held, uint8_t* out) {
  const size_t width = held ? sizeof(uint16_t) : sizeof(float);
  if (bytes % width != 0) {
    throw CryptoError("replica image: section '" + s.name + "' is not " + (held ? "bf16" : "fp32"));
  }
  const size_t k = bytes / width;
  const size_t frame = ZSTD_findFrameCompressedSize(s.data(), s.size());
  if (ZSTD_isError(frame) || s.size() - frame != k) {
    throw CryptoError("replica image: section '" + s.name + "' does not hold its two planes");
  }
  const uint8_t* low = s.data() + frame;
  decompress(s.name, s.data(), frame, nullptr, k, [&](size_t at, const uint8_t* high, size_t m) {
    for (size_t i = 0; i < m; ++i) {
      const auto h = static_cast<uint16_t>((high[i] << 8) | low[at + i]);
      if (held) {
        std::memcpy(out + 2 * (at + i), &h, 2);
      } else {
        const float f = kernels::bf16_to_fp32(h);
        std::memcpy(out + 4 * (at + i), &f, 4);
      }
    }
  });
}

// One entry of an image's replica meta: a section, how it is stored and its
// bytes once decoded.
struct ImageEntry {
  std::string name;
  std::string encoding;
  uint64_t bytes = 0;
};

std::vector<ImageEntry> image_entries(const nlohmann::json& r) {
  std::vector<ImageEntry> out;
  for (const nlohmann::json& e : r["sections"]) {
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() ||
        !e.contains("encoding") || !e["encoding"].is_string() || !e.contains("bytes") ||
        !e["bytes"].is_number_unsigned()) {
      throw CryptoError("replica image: a section entry lacks name, encoding or bytes");
    }
    out.push_back({e["name"].get<std::string>(), e["encoding"].get<std::string>(),
                   e["bytes"].get<uint64_t>()});
    if (out.back().bytes > kMaxRawBytes) {
      throw CryptoError("replica image: section '" + out.back().name + "' too big");
    }
  }
  return out;
}

// Entry e's section of the image decoded into out[0..e.bytes); an XOR
// section against `base` (n floats, already checked against the image).
void decode_into(const ImageEntry& e, const CheckpointSection& s, const float* base, size_t n,
                 uint8_t* out) {
  if (e.encoding == kXor) {
    if (e.bytes != n * sizeof(float)) {
      throw CryptoError("replica image: section '" + e.name + "' is not the size of the model");
    }
    decompress(s, out, e.bytes);
    for (size_t i = 0; i < n; ++i) {
      uint32_t a = 0, b = 0;
      std::memcpy(&a, out + 4 * i, 4);
      std::memcpy(&b, base + i, 4);
      a ^= b;
      std::memcpy(out + 4 * i, &a, 4);
    }
  } else if (e.encoding == kBf16 || e.encoding == kBf16Held) {
    from_bf16_planes(s, e.bytes, e.encoding == kBf16Held, out);
  } else if (e.encoding == kZstd) {
    decompress(s, out, e.bytes);
  } else {
    std::string why = "replica image: section '" + e.name + "' has unknown encoding '";
    why += e.encoding;
    why += "'";
    throw CryptoError(why);
  }
}

void compressed(const uint8_t* data, size_t n, const Sink& sink) {
  Compressor z(n, sink);
  z.feed(data, n, true);
}

bool listed(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

const nlohmann::json& replica_meta(const nlohmann::json& meta) {
  if (!meta.contains("replica") || !meta["replica"].is_object()) {
    throw CryptoError("replica image: its meta has no replica entry");
  }
  const nlohmann::json& r = meta["replica"];
  if (!r.contains("base") || !r["base"].is_string() || !r.contains("base_sha256") ||
      !r["base_sha256"].is_string() || !r.contains("sections") || !r["sections"].is_array()) {
    throw CryptoError("replica image: its replica entry lacks base, base_sha256 or sections");
  }
  return r;
}

CheckpointSection meta_section(const nlohmann::json& meta) {
  const std::string m = meta.dump();
  return section(kMeta, std::vector<uint8_t>(m.begin(), m.end()));
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
    CheckpointSection out = section(s.name, {});
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
            k, [&](size_t at, size_t m, uint8_t* o) { std::memcpy(o, data + 2 * at, 2 * m); },
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
  const Sha256Digest digest =
      base_sha256 != nullptr ? *base_sha256 : sha256(base->data(), base->size());
  meta["replica"] = {{"base", plan.base},
                     {"base_sha256", to_hex(digest.data(), digest.size())},
                     {"sections", std::move(sections)}};
  image.sections.push_back(meta_section(meta));
  return image;
}

bool is_replica_image(const Checkpoint& c) {
  const nlohmann::json meta = checkpoint_meta(c);
  return meta.contains("replica");
}

std::array<uint8_t, 32> replica_base_sha256(const Checkpoint& image) {
  const nlohmann::json meta = checkpoint_meta(image);
  const std::string hex = replica_meta(meta)["base_sha256"].get<std::string>();
  std::array<uint8_t, 32> d{};
  if (hex.size() != 64) throw CryptoError("replica image: base_sha256 is not 64 hex digits");
  for (size_t i = 0; i < d.size(); ++i) {
    unsigned v = 0;
    for (size_t k = 0; k < 2; ++k) {
      const char ch = hex[2 * i + k];
      const int x = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
      if (x < 0) throw CryptoError("replica image: base_sha256 is not lower-case hex");
      v = v * 16 + static_cast<unsigned>(x);
    }
    d[i] = static_cast<uint8_t>(v);
  }
  return d;
}

Checkpoint expand_replica_image(const Checkpoint& image, const float* base, size_t n) {
  nlohmann::json meta = checkpoint_meta(image);
  const nlohmann::json r = replica_meta(meta);
  const std::string base_name = r["base"].get<std::string>();
  if (base != nullptr && sha256(base, n * sizeof(float)) != replica_base_sha256(image)) {
    throw CryptoError("replica image: the model given is not the one it was made against");
  }
  Checkpoint c;
  c.round = image.round;
  c.topology_digest = image.topology_digest;
  c.node_id = image.node_id;
  if (base != nullptr) {
    CheckpointSection b;  // a view: no copy of the model
    b.name = base_name;
    static const uint8_t kNone = 0;
    b.view = n > 0 ? reinterpret_cast<const uint8_t*>(base) : &kNone;
    b.view_size = n * sizeof(float);
    c.sections.push_back(std::move(b));
  }
  for (const ImageEntry& e : image_entries(r)) {
    const CheckpointSection* s = image.find(e.name);
    if (s == nullptr || e.name == kMeta || e.name == base_name) {
      throw CryptoError("replica image: section '" + e.name + "' is missing or misplaced");
    }
    if (e.encoding == kXor && base == nullptr) continue;
    CheckpointSection out = section(e.name, std::vector<uint8_t>(e.bytes));
    decode_into(e, *s, base, n, out.bytes.data());
    c.sections.push_back(std::move(out));
  }
  meta.erase("replica");
  c.sections.push_back(meta_section(meta));
  return c;
}

std::optional<uint64_t> replica_section_size(const Checkpoint& image, const std::string& name) {
  const nlohmann::json meta = checkpoint_meta(image);
  for (const ImageEntry& e : image_entries(replica_meta(meta))) {
    if (e.name == name) return e.bytes;
  }
  return std::nullopt;
}

void expand_replica_section(const Checkpoint& image, const std::string& name, const float* base,
                            size_t n, uint8_t* out, size_t out_bytes) {
  const nlohmann::json meta = checkpoint_meta(image);
  const nlohmann::json& r = replica_meta(meta);
  for (const ImageEntry& e : image_entries(r)) {
    if (e.name != name) continue;
    const CheckpointSection* s = image.find(name);
    if (s == nullptr || name == kMeta || name == r["base"].get<std::string>()) {
      throw CryptoError("replica image: section '" + name + "' is missing or misplaced");
    }
    if (e.bytes != out_bytes) {
      throw CryptoError("replica image: section '" + name + "' holds " + std::to_string(e.bytes) +
                        " bytes, not " + std::to_string(out_bytes));
    }
    if (e.encoding == kXor &&
        (base == nullptr || sha256(base, n * sizeof(float)) != replica_base_sha256(image))) {
      throw CryptoError("replica image: the model given is not the one it was made against");
    }
    decode_into(e, *s, base, n, out);
    return;
  }
  throw CryptoError("replica image: it has no section '" + name + "'");
}

}  // namespace fedwan::checkpoint
