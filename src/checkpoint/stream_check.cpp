// StreamCheck, and check_checkpoint_stream, which runs one over a file on
// disk.
#include "checkpoint/stream_check.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "checkpoint/replica_store.hpp"
#include "common/errno_text.hpp"
#include "common/node_id.hpp"

namespace fedwan::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr uint8_t kMagic[4] = {'F', 'W', 'C', 'K'};
constexpr size_t kDigestSize = 32;
// magic, version, flags, round, topology digest, node id length.
constexpr size_t kFixedHeaderSize = 4 + 2 + 2 + 8 + kDigestSize + 2;
// What the head must hold to check a file: the fixed header, the longest
// node id, and a signed file's certificate with its length.
constexpr size_t kHeadSize =
    kFixedHeaderSize + kMaxNodeIdLength + 2 + security::kMaxSignerCertBytes;
constexpr size_t kSignatureBlock = 2 + kCheckpointSignatureSlot;
// The most bytes after the manifest: its digest and a signature block.
constexpr size_t kMaxTrailer = kDigestSize + kSignatureBlock;
constexpr size_t kReadPiece = size_t{1} << 20;

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

uint64_t get_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string digest_prefix(const uint8_t* d) { return to_hex(d, kDigestSize).substr(0, 12); }

// What a file's head says, once its format, lengths and node id passed.
struct StreamHead {
  bool is_signed = false;
  size_t trailer = 0;  // the manifest digest, and a signed file's signature block
  CheckpointIdentity id;
  std::vector<uint8_t> cert;  // a signed file's signer, DER
};

// Reads the kept head of a file of `total` bytes into *out: nullopt, or why
// it is no checkpoint (`at` names the file). Each length is checked against
// `total` before the head is read past it.
std::optional<std::string> parse_head(const std::vector<uint8_t>& head, uint64_t total,
                                      const std::string& at, StreamHead* out) {
  const auto too_short = [&] {
    return at + "too short (" + std::to_string(total) + " bytes) to be a checkpoint";
  };
  if (total < kFixedHeaderSize + 1 + 4 + kDigestSize) return too_short();
  const uint8_t* h = head.data();
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0) {
    return at + "bad magic: not a fedwan checkpoint file";
  }
  const uint64_t version = get_le(h + 4, 2);
  if (version != kCheckpointVersion && version != 1) {
    return at + "format version " + std::to_string(version) + " is not one this build reads";
  }
  const uint64_t flags = get_le(h + 6, 2);
  const uint64_t known = version == 1 ? 0 : kCheckpointFlagSigned;
  if ((flags & ~known) != 0) {
    return at + "unknown flags: the checkpoint is corrupt";
  }
  const bool is_signed = (flags & kCheckpointFlagSigned) != 0;
  out->is_signed = is_signed;
  CheckpointIdentity& id = out->id;
  id.round = get_le(h + 8, 8);
  std::memcpy(id.topology_digest.data(), h + 16, kDigestSize);
  const uint64_t id_len = get_le(h + 48, 2);
  if (id_len == 0 || id_len > kMaxNodeIdLength) {
    return at + "node id length " + std::to_string(id_len) + " outside 1.." +
           std::to_string(kMaxNodeIdLength) + ": the checkpoint is corrupt";
  }
  const size_t trailer = kDigestSize + (is_signed ? kSignatureBlock : 0);
  out->trailer = trailer;
  size_t head_end = kFixedHeaderSize + id_len;
  if (is_signed) {
    if (total < head_end + 2) return too_short();
    const uint64_t cert_len = get_le(h + head_end, 2);
    if (cert_len == 0 || cert_len > security::kMaxSignerCertBytes) {
      return at + "signer certificate length " + std::to_string(cert_len) +
             " out of range: the checkpoint is corrupt";
    }
    head_end += 2 + cert_len;
    if (total < head_end) return too_short();
    out->cert.assign(h + head_end - cert_len, h + head_end);
  }
  if (total < head_end + 4 + trailer) return too_short();
  id.node_id.assign(reinterpret_cast<const char*>(h + kFixedHeaderSize), id_len);
  if (!is_valid_node_id(id.node_id)) {
    return at + "node id is not [A-Za-z0-9._-]: the checkpoint is corrupt";
  }
  return std::nullopt;
}

// The signature block after `stored` (the manifest digest), and its
// signature over that digest by `cert`, as `check` expects.
std::optional<std::string> check_signature(const uint8_t* stored, const std::vector<uint8_t>& cert,
                                           const CheckpointSignerCheck& check,
                                           const std::string& at) {
  const uint8_t* block = stored + kDigestSize;
  const size_t sig_len = get_le(block, 2);
  if (sig_len == 0 || sig_len > kCheckpointSignatureSlot ||
      std::any_of(block + 2 + sig_len, block + kSignatureBlock, [](uint8_t b) { return b != 0; })) {
    return at + "malformed signature block: the checkpoint is corrupt";
  }
  const std::vector<uint8_t> sig(block + 2, block + 2 + sig_len);
  if (auto bad =
          check.verifier->verify(cert, kCheckpointDomain, stored, kDigestSize, sig, check.signer)) {
    return at + "its signature does not verify: " + *bad;
  }
  return std::nullopt;
}

}  // namespace

void StreamCheck::feed(const uint8_t* p, size_t n) {
  if (head_.size() < kHeadSize) {
    head_.insert(head_.end(), p, p + std::min(n, kHeadSize - head_.size()));
  }
  offset_ += n;
  if (n >= kMaxTrailer) {
    hash_.update(tail_.data(), tail_.size());
    hash_.update(p, n - kMaxTrailer);
    tail_.assign(p + n - kMaxTrailer, p + n);
    return;
  }
  tail_.insert(tail_.end(), p, p + n);
  if (tail_.size() > kMaxTrailer) {
    const size_t extra = tail_.size() - kMaxTrailer;
    hash_.update(tail_.data(), extra);
    tail_.erase(tail_.begin(), tail_.begin() + static_cast<std::ptrdiff_t>(extra));
  }
}

std::optional<std::string> StreamCheck::finish(const fs::path& path, const std::string& node,
                                               const Sha256Digest& digest, CheckpointIdentity* out,
                                               const CheckpointSignerCheck& check) {
  const std::string at = "checkpoint " + path.string() + ": ";
  if (offset_ != total_) {
    return at + "truncated: read " + std::to_string(offset_) + " of " + std::to_string(total_) +
           " bytes";
  }
  StreamHead head;
  if (std::optional<std::string> bad = parse_head(head_, total_, at, &head)) return bad;
  // The kept tail: the body's last bytes (hashed now), then the trailer.
  const size_t body_in_tail = tail_.size() - head.trailer;
  hash_.update(tail_.data(), body_in_tail);
  const uint8_t* stored = tail_.data() + body_in_tail;
  // Integrity before identity, so a damaged id reads as damage, not as a
  // foreign file.
  const Sha256Digest body = hash_.finish();
  if (!std::equal(body.begin(), body.end(), stored, stored + kDigestSize)) {
    return at + "digest mismatch: the file is corrupt or incomplete";
  }
  const CheckpointIdentity& id = head.id;
  if (id.node_id != node) {
    return at + "holds node '" + id.node_id + "''s checkpoint, not '" + node + "''s";
  }
  if (id.topology_digest != digest) {
    return at + "was written under topology " + digest_prefix(id.topology_digest.data()) +
           ", expected " + digest_prefix(digest.data());
  }
  if (check.verifier) {
    if (!head.is_signed) {
      return at + "it is not signed; only checkpoints signed by '" + node + "' are kept";
    }
    if (std::optional<std::string> bad = check_signature(stored, head.cert, check, at)) return bad;
  }
  if (out) *out = std::move(head.id);
  return std::nullopt;
}

std::optional<std::string> check_checkpoint_stream(const fs::path& path,
                                                   const std::string& expected_node,
                                                   const std::array<uint8_t, 32>& expected_digest,
                                                   CheckpointIdentity* out,
                                                   const CheckpointSignerCheck& check) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) return "cannot open checkpoint " + path.string() + ": " + errno_text(errno);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) {
    return "cannot stat checkpoint " + path.string() + ": " + errno_text(errno);
  }
  if (!S_ISREG(st.st_mode)) return "checkpoint " + path.string() + " is not a regular file";
  const auto size = static_cast<uint64_t>(st.st_size);
  StreamCheck stream(size);
  std::vector<uint8_t> buf(static_cast<size_t>(std::min<uint64_t>(size, kReadPiece)));
  for (uint64_t left = size; left > 0;) {
    const ssize_t r =
        ::read(f.fd, buf.data(), static_cast<size_t>(std::min<uint64_t>(left, buf.size())));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return "cannot read checkpoint " + path.string() + ": " + errno_text(errno);
    if (r == 0) break;  // shrank since fstat: finish() reports it truncated
    stream.feed(buf.data(), static_cast<size_t>(r));
    left -= static_cast<uint64_t>(r);
  }
  return stream.finish(path, expected_node, expected_digest, out, check);
}

}  // namespace fedwan::checkpoint
