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
// Version 3: the head with the longest manifest.
constexpr size_t kManifestEntryMax = 2 + kMaxCheckpointSectionNameLength + 8 + kDigestSize;
constexpr size_t kHeadWithManifest = kHeadSize + 4 + kMaxCheckpointSections * kManifestEntryMax;

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
  size_t head_end = 0;  // where the manifest begins
  size_t trailer = 0;   // the manifest digest, and a signed file's signature block
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
  if (version == 0 || version > kCheckpointVersion) {
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
  out->head_end = head_end;
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

enum class Parse { kMore, kBad, kOk };

// Version 3: the manifest at `at` in `b`, once `b` holds all of it. kOk
// with *end where the section bytes begin; kBad with *why.
Parse parse_manifest(const std::vector<uint8_t>& b, size_t at, uint64_t total,
                     std::vector<StreamCheck::Section>* out, size_t* end, std::string* why) {
  const auto have = [&](size_t n) { return at + n <= b.size(); };
  if (!have(4)) return Parse::kMore;
  const uint64_t count = get_le(b.data() + at, 4);
  at += 4;
  if (count > kMaxCheckpointSections) {
    *why = "section count " + std::to_string(count) + " over the limit: the checkpoint is corrupt";
    return Parse::kBad;
  }
  out->clear();
  std::vector<std::string> names;
  uint64_t claimed = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (!have(2)) return Parse::kMore;
    const uint64_t len = get_le(b.data() + at, 2);
    at += 2;
    if (len == 0 || len > kMaxCheckpointSectionNameLength) {
      *why =
          "section " + std::to_string(i) + " name length out of range: the checkpoint is corrupt";
      return Parse::kBad;
    }
    if (!have(len + 8 + kDigestSize)) return Parse::kMore;
    std::string name(reinterpret_cast<const char*>(b.data() + at), len);
    at += len;
    if (!is_valid_checkpoint_section_name(name) ||
        std::find(names.begin(), names.end(), name) != names.end()) {
      *why = "section " + std::to_string(i) +
             " name is invalid or repeated: the checkpoint is corrupt";
      return Parse::kBad;
    }
    names.push_back(std::move(name));
    StreamCheck::Section sec;
    sec.length = get_le(b.data() + at, 8);
    at += 8;
    std::memcpy(sec.digest.data(), b.data() + at, kDigestSize);
    at += kDigestSize;
    if (sec.length > total - claimed) {
      *why = "truncated: section " + std::to_string(i) + " claims more bytes than the file holds";
      return Parse::kBad;
    }
    claimed += sec.length;
    out->push_back(sec);
  }
  *end = at;
  return Parse::kOk;
}

}  // namespace

void StreamCheck::feed(const uint8_t* p, size_t n) {
  offset_ += n;
  if (mode_ == Mode::kUnknown) {
    // The version decides how the file is hashed.
    first_.insert(first_.end(), p, p + n);
    if (first_.size() < 6 && offset_ < total_) return;
    mode_ =
        first_.size() >= 6 && get_le(first_.data() + 4, 2) >= 3 ? Mode::kSections : Mode::kWhole;
    const std::vector<uint8_t> b = std::move(first_);
    first_.clear();
    if (mode_ == Mode::kWhole) consume_whole(b.data(), b.size());
    if (mode_ == Mode::kSections) consume_sections(b.data(), b.size());
    return;
  }
  if (mode_ == Mode::kWhole) consume_whole(p, n);
  if (mode_ == Mode::kSections) consume_sections(p, n);
}

void StreamCheck::consume_sections(const uint8_t* p, size_t n) {
  while (n > 0 && !bad_) {
    if (parsed_) {
      section_bytes(p, n);
      return;
    }
    const size_t take = std::min(n, kHeadWithManifest - head_.size());
    if (take == 0) {  // no manifest is this long
      bad_ = "its manifest does not end where it must: the checkpoint is corrupt";
      return;
    }
    head_.insert(head_.end(), p, p + take);
    p += take;
    n -= take;
    if (head_.size() < std::min<uint64_t>(total_, kHeadSize)) continue;
    StreamHead head;
    if (std::optional<std::string> bad = parse_head(head_, total_, "", &head)) {
      bad_ = std::move(bad);
      return;
    }
    size_t end = 0;
    std::string why;
    switch (parse_manifest(head_, head.head_end, total_, &sections_, &end, &why)) {
      case Parse::kMore: continue;  // the stream's end, if it comes first, is reported by finish()
      case Parse::kBad: bad_ = why; return;
      case Parse::kOk: break;
    }
    parsed_ = true;
    header_digest_ = sha256(head_.data(), end);
    const std::vector<uint8_t> surplus(head_.begin() + static_cast<std::ptrdiff_t>(end),
                                       head_.end());
    head_.resize(end);
    section_ = 0;
    next_section();
    if (!surplus.empty()) section_bytes(surplus.data(), surplus.size());
  }
}

// Skips to the next section with bytes (an empty one is checked as it is
// passed).
void StreamCheck::next_section() {
  static const uint8_t kNothing = 0;
  static const Sha256Digest kEmpty = sha256(&kNothing, 0);
  while (section_ < sections_.size() && sections_[section_].length == 0) {
    if (sections_[section_].digest != kEmpty) {
      bad_ = "section " + std::to_string(section_) + " digest mismatch: the file is corrupt";
      return;
    }
    section_ += 1;
  }
  left_ = section_ < sections_.size() ? sections_[section_].length : 0;
}

void StreamCheck::section_bytes(const uint8_t* p, size_t n) {
  while (n > 0 && !bad_) {
    if (section_ >= sections_.size()) {
      trailer_.insert(trailer_.end(), p, p + n);
      if (trailer_.size() > kMaxTrailer) bad_ = "bytes after the trailer: the file is corrupt";
      return;
    }
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n, left_));
    hash_.update(p, take);
    p += take;
    n -= take;
    left_ -= take;
    if (left_ > 0) continue;
    if (hash_.finish() != sections_[section_].digest) {
      bad_ = "section " + std::to_string(section_) + " digest mismatch: the file is corrupt";
      return;
    }
    section_ += 1;
    next_section();
  }
}

void StreamCheck::consume_whole(const uint8_t* p, size_t n) {
  if (head_.size() < kHeadSize) {
    head_.insert(head_.end(), p, p + std::min(n, kHeadSize - head_.size()));
  }
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
  if (mode_ == Mode::kSections && bad_) return at + *bad_;
  if (mode_ == Mode::kUnknown) return at + "too short to be a checkpoint";
  StreamHead head;
  if (std::optional<std::string> bad = parse_head(head_, total_, at, &head)) return bad;
  const uint8_t* stored = nullptr;
  Sha256Digest computed{};
  if (mode_ == Mode::kSections) {
    if (parsed_ && section_ >= sections_.size() && trailer_.size() > head.trailer) {
      return at + "bytes after the trailer: the file is corrupt";
    }
    if (!parsed_ || section_ < sections_.size() || trailer_.size() != head.trailer) {
      return at + "truncated: its sections and trailer do not fill the file";
    }
    stored = trailer_.data();
    computed = header_digest_;
  } else {
    // The kept tail: the body's last bytes (hashed now), then the trailer.
    const size_t body_in_tail = tail_.size() - head.trailer;
    hash_.update(tail_.data(), body_in_tail);
    stored = tail_.data() + body_in_tail;
    computed = hash_.finish();
  }
  // Integrity before identity, so a damaged id reads as damage, not as a
  // foreign file.
  if (!std::equal(computed.begin(), computed.end(), stored, stored + kDigestSize)) {
    return at + "digest mismatch: the file is corrupt or incomplete";
  }
  head.id.digest = computed;
  head.id.is_signed = head.is_signed;
  if (any_identity_) {
    if (out) *out = std::move(head.id);
    return std::nullopt;
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

namespace {

// Runs a StreamCheck over the file at `path`, in kReadPiece reads.
std::optional<std::string> check_file(const fs::path& path, bool any_identity,
                                      const std::string& expected_node,
                                      const std::array<uint8_t, 32>& expected_digest,
                                      CheckpointIdentity* out, const CheckpointSignerCheck& check) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) return "cannot open checkpoint " + path.string() + ": " + errno_text(errno);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) {
    return "cannot stat checkpoint " + path.string() + ": " + errno_text(errno);
  }
  if (!S_ISREG(st.st_mode)) return "checkpoint " + path.string() + " is not a regular file";
  const auto size = static_cast<uint64_t>(st.st_size);
  StreamCheck stream(size);
  if (any_identity) stream.accept_any_identity();
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

}  // namespace

std::optional<std::string> check_checkpoint_stream(const fs::path& path,
                                                   const std::string& expected_node,
                                                   const std::array<uint8_t, 32>& expected_digest,
                                                   CheckpointIdentity* out,
                                                   const CheckpointSignerCheck& check) {
  return check_file(path, /*any_identity=*/false, expected_node, expected_digest, out, check);
}

std::optional<std::string> check_checkpoint_integrity(const fs::path& path,
                                                      CheckpointIdentity* out) {
  return check_file(path, /*any_identity=*/true, "", {}, out, {});
}

}  // namespace fedwan::checkpoint
