// What an attacker without a node's key can do to its signed checkpoint:
// edit it and recompute every digest (sections and manifest), keeping the
// signer's certificate and the old signature block. The file is then intact
// to any integrity check; only the signature tells the forgery.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

#include "checkpoint/checkpoint_file.hpp"
#include "common/sha256.hpp"

namespace fedwan::testing {

inline std::vector<uint8_t> read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::filesystem::path& p, const std::vector<uint8_t>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Rewrites the signed checkpoint at `path` with `c`'s content re-hashed,
// keeping the signer's certificate and signature block of the original.
// `version` 2 hashes the section bytes into the manifest digest too.
inline void forge_signed_checkpoint(const std::filesystem::path& path, const Checkpoint& c,
                                    uint16_t version = kCheckpointVersion) {
  const std::vector<uint8_t> orig = read_bytes(path);
  const size_t id_len = orig.at(48) | (orig.at(49) << 8);
  const size_t cert_at = 50 + id_len;
  const size_t cert_len = orig.at(cert_at) | (orig.at(cert_at + 1) << 8);
  if ((orig.at(6) & 1) == 0) throw std::runtime_error("not a signed checkpoint");
  const std::vector<uint8_t> cert(orig.begin() + cert_at, orig.begin() + cert_at + 2 + cert_len);
  const std::vector<uint8_t> sig_block(orig.end() - 2 - kCheckpointSignatureSlot, orig.end());
  std::vector<uint8_t> out;
  auto put = [&](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  out.insert(out.end(), {'F', 'W', 'C', 'K'});
  put(version, 2);
  put(kCheckpointFlagSigned, 2);
  put(c.round, 8);
  out.insert(out.end(), c.topology_digest.begin(), c.topology_digest.end());
  put(c.node_id.size(), 2);
  out.insert(out.end(), c.node_id.begin(), c.node_id.end());
  out.insert(out.end(), cert.begin(), cert.end());
  put(c.sections.size(), 4);
  for (const CheckpointSection& s : c.sections) {
    put(s.name.size(), 2);
    out.insert(out.end(), s.name.begin(), s.name.end());
    put(s.bytes.size(), 8);
    const Sha256Digest d = sha256(s.bytes.data(), s.bytes.size());
    out.insert(out.end(), d.begin(), d.end());
  }
  const size_t header = out.size();
  for (const CheckpointSection& s : c.sections)
    out.insert(out.end(), s.bytes.begin(), s.bytes.end());
  const Sha256Digest manifest = sha256(out.data(), version >= 3 ? header : out.size());
  out.insert(out.end(), manifest.begin(), manifest.end());
  out.insert(out.end(), sig_block.begin(), sig_block.end());
  write_bytes(path, out);
}

}  // namespace fedwan::testing
