// Reading a replica image back (replica_image.hpp). Each section is decoded
// as it streams from the image, which may still be in its file
// (CheckpointSection::stored): nothing of the image is held beyond a piece
// of the file, a working block and zstd's window, and each array is
// written once, into the caller's buffer.
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
#include "checkpoint/replica_image.hpp"
#include "codec/half.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"

namespace fedwan::checkpoint {
namespace {

using replica::kBf16;
using replica::kBf16Held;
using replica::kBlockFloats;
using replica::kMaxRawBytes;
using replica::kMeta;
using replica::kXor;
using replica::kZstd;

struct DCtxFree {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};

// Bytes [at, at + k) of a section, decoded.
using TakeBlock = std::function<void(uint64_t at, const uint8_t* block, size_t k)>;

// One zstd frame, fed in pieces as they are read, that must decode to
// exactly n bytes: into out[0..n) or, with `take`, a working block at a
// time. Nothing is written past n, whatever the frame says.
class Decompressor {
 public:
  Decompressor(const std::string& name, uint64_t n, uint8_t* out, TakeBlock take)
      : what_("replica image section '" + name + "': "),
        n_(n),
        out_(out),
        take_(std::move(take)),
        ctx_(ZSTD_createDCtx()) {
    if (!ctx_) throw Error("replica image: zstd cannot allocate a decompression context");
    if (take_) block_.resize(static_cast<size_t>(std::min<uint64_t>(n, kBlockFloats * 4)));
  }

  void feed(const uint8_t* data, size_t size) {
    if (!started_) {
      // The frame says its size (the writer pledges it): refused before a
      // byte is written when it is not the meta's.
      if (ZSTD_getFrameContentSize(data, size) != n_) {
        throw CryptoError(what_ + "its compressed size does not match the meta");
      }
      started_ = true;
    }
    ZSTD_inBuffer in{data, size, 0};
    while (in.pos < in.size) {
      if (complete_) throw CryptoError(what_ + "it holds bytes past its frame");
      ZSTD_outBuffer o = take_ ? ZSTD_outBuffer{block_.data(), block_.size(), 0}
                               : ZSTD_outBuffer{out_ + done_, static_cast<size_t>(n_ - done_), 0};
      const size_t in_before = in.pos;
      const size_t r = ZSTD_decompressStream(ctx_.get(), &o, &in);
      if (ZSTD_isError(r)) throw CryptoError(what_ + "zstd: " + ZSTD_getErrorName(r));
      if (done_ + o.pos > n_) throw CryptoError(what_ + "it holds more than the meta says");
      if (o.pos > 0 && take_) take_(done_, block_.data(), o.pos);
      done_ += o.pos;
      if (r == 0) {
        complete_ = true;
      } else if (in.pos == in_before && o.pos == 0) {
        throw CryptoError(what_ + "it holds more than the meta says");  // no room left
      }
    }
  }

  // The frame ended, exactly n bytes out.
  void finish() const {
    if (!complete_ || done_ != n_) {
      throw CryptoError(what_ + (done_ < n_ ? "it is cut short"
                                            : "it does not hold exactly the bytes the meta says"));
    }
  }

 private:
  std::string what_;
  uint64_t n_;
  uint8_t* out_;
  TakeBlock take_;
  std::unique_ptr<ZSTD_DCtx, DCtxFree> ctx_;
  std::vector<uint8_t> block_;
  uint64_t done_ = 0;
  bool started_ = false;
  bool complete_ = false;
};

// One entry of an image's replica meta: a section, how it is stored and its
// bytes once decoded.
struct ImageEntry {
  std::string name;
  std::string encoding;
  uint64_t bytes = 0;
};

// Section s, one zstd frame, decoded by z.
void decompress(const CheckpointSection& s, Decompressor& z) {
  stream_section(s, [&z](const uint8_t* data, size_t n) { z.feed(data, n); });
  z.finish();
}

// A section stored as bf16 byte planes (a zstd frame of the high bytes,
// then the low bytes as they are) decoded into out[0..e.bytes): fp32
// values, or bf16 when held. The high plane is decoded into the tail of
// `out`; value j, written once its low byte comes, covers only bytes of
// that tail already read (it ends before the high byte of value j + 1), so
// no plane is held anywhere else.
void from_bf16_planes(const ImageEntry& e, const CheckpointSection& s, uint8_t* out) {
  const bool held = e.encoding == kBf16Held;
  const size_t width = held ? sizeof(uint16_t) : sizeof(float);
  if (e.bytes % width != 0) {
    throw CryptoError("replica image: section '" + e.name + "' is not " + (held ? "bf16" : "fp32"));
  }
  const uint64_t k = e.bytes / width;
  const uint64_t size = s.size();
  if (size <= k) {
    throw CryptoError("replica image: section '" + e.name + "' does not hold its two planes");
  }
  const uint64_t frame = size - k;
  const uint8_t* high = out + (e.bytes - k);
  Decompressor z(e.name, k, out + (e.bytes - k), nullptr);
  uint64_t pos = 0;
  stream_section(s, [&](const uint8_t* data, size_t m) {
    if (pos < frame) {
      const auto f = static_cast<size_t>(std::min<uint64_t>(m, frame - pos));
      z.feed(data, f);
      pos += f;
      data += f;
      m -= f;
      if (pos == frame) z.finish();  // the low plane starts where the frame ends
    }
    const uint64_t j0 = pos - frame;
    if (held) {
      for (size_t i = 0; i < m; ++i) {
        const auto h = static_cast<uint16_t>((high[j0 + i] << 8) | data[i]);
        std::memcpy(out + 2 * (j0 + i), &h, 2);
      }
    } else {
      for (size_t i = 0; i < m; ++i) {
        const float f = kernels::bf16_to_fp32(static_cast<uint16_t>((high[j0 + i] << 8) | data[i]));
        std::memcpy(out + 4 * (j0 + i), &f, 4);
      }
    }
    pos += m;
  });
}

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
// section against `base` (n floats, already checked against the image),
// each block XORed as it comes.
void decode_into(const ImageEntry& e, const CheckpointSection& s, const float* base, size_t n,
                 uint8_t* out) {
  if (e.encoding == kXor) {
    if (e.bytes != n * sizeof(float)) {
      throw CryptoError("replica image: section '" + e.name + "' is not the size of the model");
    }
    const auto* b = reinterpret_cast<const uint8_t*>(base);
    Decompressor z(e.name, e.bytes, nullptr, [&](uint64_t at, const uint8_t* block, size_t k) {
      for (size_t i = 0; i < k; ++i) out[at + i] = static_cast<uint8_t>(block[i] ^ b[at + i]);
    });
    decompress(s, z);
  } else if (e.encoding == kBf16 || e.encoding == kBf16Held) {
    from_bf16_planes(e, s, out);
  } else if (e.encoding == kZstd) {
    Decompressor z(e.name, e.bytes, out, nullptr);
    decompress(s, z);
  } else {
    std::string why = "replica image: section '" + e.name + "' has unknown encoding '";
    why += e.encoding;
    why += "'";
    throw CryptoError(why);
  }
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

// Entry e's section of the image, which must be there and be neither the
// meta nor the base.
const CheckpointSection& entry_section(const Checkpoint& image, const nlohmann::json& r,
                                       const ImageEntry& e) {
  const CheckpointSection* s = image.find(e.name);
  if (s == nullptr || e.name == kMeta || e.name == r["base"].get<std::string>()) {
    throw CryptoError("replica image: section '" + e.name + "' is missing or misplaced");
  }
  return *s;
}

}  // namespace

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
    const CheckpointSection& s = entry_section(image, r, e);
    if (e.encoding == kXor && base == nullptr) continue;
    CheckpointSection out = replica::plain_section(e.name, std::vector<uint8_t>(e.bytes));
    decode_into(e, s, base, n, out.bytes.data());
    c.sections.push_back(std::move(out));
  }
  meta.erase("replica");
  c.sections.push_back(replica::meta_section(meta));
  return c;
}

std::vector<std::string> replica_section_names(const Checkpoint& image) {
  const nlohmann::json meta = checkpoint_meta(image);
  std::vector<std::string> out;
  for (const ImageEntry& e : image_entries(replica_meta(meta))) out.push_back(e.name);
  return out;
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
    const CheckpointSection& s = entry_section(image, r, e);
    if (e.bytes != out_bytes) {
      throw CryptoError("replica image: section '" + name + "' holds " + std::to_string(e.bytes) +
                        " bytes, not " + std::to_string(out_bytes));
    }
    if (e.encoding == kXor &&
        (base == nullptr || sha256(base, n * sizeof(float)) != replica_base_sha256(image))) {
      throw CryptoError("replica image: the model given is not the one it was made against");
    }
    decode_into(e, s, base, n, out);
    return;
  }
  throw CryptoError("replica image: it has no section '" + name + "'");
}

}  // namespace fedwan::checkpoint
