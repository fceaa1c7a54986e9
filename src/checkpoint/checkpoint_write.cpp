// Writing a checkpoint file (checkpoint_file.hpp): the header and manifest,
// the sections streamed from their bytes, views, producers or files, the manifest
// digest and the signature, committed atomically.
#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "checkpoint/checkpoint_file.hpp"
#include "checkpoint/checkpoint_format.hpp"
#include "common/atomic_file.hpp"
#include "common/background_sha256.hpp"
#include "common/crash_point.hpp"
#include "common/errno_text.hpp"
#include "common/node_id.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"

namespace fedwan {
namespace {

namespace fs = std::filesystem;
using checkpoint_format::kMagic;
using checkpoint_format::throw_io;

constexpr mode_t kCheckpointMode = 0600;
constexpr uint64_t kStallBlock = 1 << 20;

void put_u16(std::vector<uint8_t>& out, uint16_t v) {
  for (int i = 0; i < 2; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void check_encodable(const Checkpoint& c) {
  if (!is_valid_node_id(c.node_id)) {
    throw ConfigError("checkpoint node id '" + c.node_id +
                      "' is invalid: use 1..64 characters of [A-Za-z0-9._-]");
  }
  if (c.sections.size() > kMaxCheckpointSections) {
    throw ConfigError("checkpoint has " + std::to_string(c.sections.size()) +
                      " sections; at most " + std::to_string(kMaxCheckpointSections) +
                      " fit: merge small sections");
  }
  std::set<std::string_view> seen;
  for (const CheckpointSection& s : c.sections) {
    if (!is_valid_checkpoint_section_name(s.name)) {
      throw ConfigError("checkpoint section name '" + s.name +
                        "' is invalid: use 1..64 characters of [a-z0-9_.-]");
    }
    if (!seen.insert(s.name).second) {
      throw ConfigError("checkpoint section name '" + s.name +
                        "' appears twice: section names must be unique");
    }
  }
}

// Everything before the section bytes: fixed header, node id, the signer's
// certificate (signed files), manifest.
// A section's length and digest in the manifest.
struct Entry {
  uint64_t size = 0;
  Sha256Digest digest{};
};

std::vector<uint8_t> encode_header(const Checkpoint& c, const security::NodeKey* key,
                                   const std::vector<Entry>& entries) {
  std::vector<uint8_t> h;
  h.insert(h.end(), std::begin(kMagic), std::end(kMagic));
  put_u16(h, kCheckpointVersion);
  put_u16(h, key != nullptr ? kCheckpointFlagSigned : 0);
  put_u64(h, c.round);
  h.insert(h.end(), c.topology_digest.begin(), c.topology_digest.end());
  put_u16(h, static_cast<uint16_t>(c.node_id.size()));
  h.insert(h.end(), c.node_id.begin(), c.node_id.end());
  if (key != nullptr) {
    const std::vector<uint8_t>& cert = key->cert_der();
    put_u16(h, static_cast<uint16_t>(cert.size()));
    h.insert(h.end(), cert.begin(), cert.end());
  }
  put_u32(h, static_cast<uint32_t>(c.sections.size()));
  for (size_t i = 0; i < c.sections.size(); ++i) {
    const CheckpointSection& s = c.sections[i];
    put_u16(h, static_cast<uint16_t>(s.name.size()));
    h.insert(h.end(), s.name.begin(), s.name.end());
    put_u64(h, entries[i].size);
    h.insert(h.end(), entries[i].digest.begin(), entries[i].digest.end());
  }
  return h;
}

}  // namespace

std::vector<Sha256Digest> write_checkpoint(const fs::path& path, const Checkpoint& c,
                                           const security::NodeKey* key,
                                           std::string_view crash_points) {
  check_encodable(c);
  if (key != nullptr && key->identity().node_id != c.node_id) {
    throw ConfigError("checkpoint of '" + c.node_id + "' cannot be signed with the key of '" +
                      key->identity().node_id + "'");
  }
  // The manifest's length does not depend on the sections' lengths or
  // digests: a produced section's are filled in once it is written.
  std::vector<Entry> entries(c.sections.size());
  // So are those of large sections in memory: they are hashed on helper threads while this one
  // writes them (common/background_sha256.hpp), so that a model-sized
  // checkpoint takes the longer of the disk's time and SHA-256's, not
  // their sum.
  std::vector<size_t> hashed_aside;
  std::vector<BackgroundSha256::Range> ranges;
  for (size_t i = 0; i < c.sections.size(); ++i) {
    const CheckpointSection& s = c.sections[i];
    if (s.produce || s.on_disk()) continue;
    entries[i].size = s.size();
    if (s.size() < BackgroundSha256::kWorthFrom) {
      entries[i].digest = sha256(s.data(), s.size());
      continue;
    }
    hashed_aside.push_back(i);
    ranges.push_back({s.data(), s.size()});
  }
  std::optional<BackgroundSha256> hashing;
  if (!ranges.empty()) hashing.emplace(std::move(ranges));
  std::vector<uint8_t> header = encode_header(c, key, entries);

  // Recovery trusts a checkpoint reported written, so unlike credentials a
  // failure to make the rename durable is reported too.
  AtomicFileWriter out(
      path, kCheckpointMode,
      [&path](std::string_view action, int err) {
        if (action == "sync directory of") {
          throw TransportError(
              "checkpoint " + path.string() +
              " was written but its directory could not be synced: " + errno_text(err) +
              "; it may not survive a power cut, write it again");
        }
        throw_io(action, path, err);
      },
      PageCache::kBypass);
  out.write(header.data(), header.size());
  // Section bytes go a MiB at a time: a stall point (a slow disk) per MiB.
  const std::string stall = std::string(crash_points) + ".block";
  uint64_t since_stall = 0;
  const auto put = [&](const uint8_t* data, size_t n) {
    while (n > 0) {
      const size_t k = std::min<size_t>(n, kStallBlock - since_stall);
      out.write(data, k);
      data += k;
      n -= k;
      since_stall += k;
      if (since_stall == kStallBlock) {
        since_stall = 0;
        stall_point(stall);
      }
    }
  };
  bool produced = false;
  for (size_t i = 0; i < c.sections.size(); ++i) {
    const CheckpointSection& s = c.sections[i];
    if (!s.produce && !s.on_disk()) {
      put(s.data(), s.size());
      continue;
    }
    Sha256 hash;
    uint64_t size = 0;
    const CheckpointSection::Sink sink = [&](const uint8_t* data, size_t n) {
      put(data, n);
      hash.update(data, n);
      size += n;
    };
    // A section still in the file it was read from is copied from there.
    if (s.produce) {
      s.produce(sink);
    } else {
      stream_section(s, sink);
    }
    entries[i] = {size, hash.finish()};
    produced = true;
  }
  if (hashing) {
    const std::vector<Sha256Digest> digests = hashing->wait();
    for (size_t k = 0; k < hashed_aside.size(); ++k) entries[hashed_aside[k]].digest = digests[k];
  }
  if (produced || hashing) {
    header = encode_header(c, key, entries);
    out.write_at(0, header.data(), header.size());
  }
  // The manifest digest covers the header, which holds every section's
  // digest: each byte is hashed once.
  const Sha256Digest digest = sha256(header.data(), header.size());
  out.write(digest.data(), digest.size());
  if (key != nullptr) {
    const std::vector<uint8_t> sig = key->sign(kCheckpointDomain, digest.data(), digest.size());
    std::vector<uint8_t> block;
    put_u16(block, static_cast<uint16_t>(sig.size()));
    block.insert(block.end(), sig.begin(), sig.end());
    block.resize(2 + kCheckpointSignatureSlot, 0);
    out.write(block.data(), block.size());
  }
  out.commit(/*require_durable_rename=*/true, [crash_points](std::string_view step) {
    crash_point(std::string(crash_points) + "." + std::string(step));
  });
  std::vector<Sha256Digest> digests;
  digests.reserve(entries.size());
  for (const Entry& e : entries) digests.push_back(e.digest);
  return digests;
}

void materialize(Checkpoint& c) {
  for (CheckpointSection& s : c.sections) {
    if (s.on_disk()) {
      s.bytes = section_bytes(s);
      s.stored.reset();
      s.stored_size = 0;
      continue;
    }
    if (!s.produce) continue;
    std::vector<uint8_t> bytes;
    s.produce(
        [&bytes](const uint8_t* data, size_t n) { bytes.insert(bytes.end(), data, data + n); });
    s.produce = nullptr;
    s.view = nullptr;
    s.bytes = std::move(bytes);
  }
}

}  // namespace fedwan
