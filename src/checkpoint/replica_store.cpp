#include "checkpoint/replica_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>
#include <system_error>
#include <utility>

#include "checkpoint/checkpoint_file.hpp"
#include "common/atomic_file.hpp"
#include "common/errno_text.hpp"
#include "common/log.hpp"
#include "common/node_id.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"

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
constexpr mode_t kReplicaMode = 0600;

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

// Checks a checkpoint fed front to back whose size is known up front: keeps
// the head bytes, hashes everything but the last kMaxTrailer bytes as they
// come, and keeps those (whether they are all trailer is known only once the
// header's flags are). Memory: kHeadSize + 2 * kMaxTrailer bytes whatever
// the file size.
class StreamCheck {
 public:
  explicit StreamCheck(uint64_t total) : total_(total) {}

  // The caller never feeds more than `total` bytes in all.
  void feed(const uint8_t* p, size_t n) {
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

  // nullopt, or why the file at `path` is not `node`'s intact checkpoint
  // (signed by `node` when `check` has a verifier).
  std::optional<std::string> finish(const fs::path& path, const std::string& node,
                                    const Sha256Digest& digest, CheckpointIdentity* out,
                                    const CheckpointSignerCheck& check) {
    const std::string at = "checkpoint " + path.string() + ": ";
    const auto too_short = [&] {
      return at + "too short (" + std::to_string(total_) + " bytes) to be a checkpoint";
    };
    if (offset_ != total_) {
      return at + "truncated: read " + std::to_string(offset_) + " of " + std::to_string(total_) +
             " bytes";
    }
    if (total_ < kFixedHeaderSize + 1 + 4 + kDigestSize) return too_short();
    const uint8_t* h = head_.data();
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
    CheckpointIdentity id;
    id.round = get_le(h + 8, 8);
    std::memcpy(id.topology_digest.data(), h + 16, kDigestSize);
    const uint64_t id_len = get_le(h + 48, 2);
    if (id_len == 0 || id_len > kMaxNodeIdLength) {
      return at + "node id length " + std::to_string(id_len) + " outside 1.." +
             std::to_string(kMaxNodeIdLength) + ": the checkpoint is corrupt";
    }
    const size_t trailer = kDigestSize + (is_signed ? kSignatureBlock : 0);
    size_t head_end = kFixedHeaderSize + id_len;
    std::vector<uint8_t> cert;
    if (is_signed) {
      if (total_ < head_end + 2) return too_short();
      const uint64_t cert_len = get_le(h + head_end, 2);
      if (cert_len == 0 || cert_len > security::kMaxSignerCertBytes) {
        return at + "signer certificate length " + std::to_string(cert_len) +
               " out of range: the checkpoint is corrupt";
      }
      head_end += 2 + cert_len;
      if (total_ < head_end) return too_short();
      cert.assign(h + head_end - cert_len, h + head_end);
    }
    if (total_ < head_end + 4 + trailer) return too_short();
    id.node_id.assign(reinterpret_cast<const char*>(h + kFixedHeaderSize), id_len);
    if (!is_valid_node_id(id.node_id)) {
      return at + "node id is not [A-Za-z0-9._-]: the checkpoint is corrupt";
    }
    // The kept tail: the body's last bytes (hashed now), then the trailer.
    const size_t body_in_tail = tail_.size() - trailer;
    hash_.update(tail_.data(), body_in_tail);
    const uint8_t* stored = tail_.data() + body_in_tail;
    // Integrity before identity, so a damaged id reads as damage, not as a
    // foreign file.
    const Sha256Digest body = hash_.finish();
    if (!std::equal(body.begin(), body.end(), stored, stored + kDigestSize)) {
      return at + "digest mismatch: the file is corrupt or incomplete";
    }
    if (id.node_id != node) {
      return at + "holds node '" + id.node_id + "''s checkpoint, not '" + node + "''s";
    }
    if (id.topology_digest != digest) {
      return at + "was written under topology " + digest_prefix(id.topology_digest.data()) +
             ", expected " + digest_prefix(digest.data());
    }
    if (check.verifier) {
      if (!is_signed) {
        return at + "it is not signed; only checkpoints signed by '" + node + "' are kept";
      }
      const uint8_t* block = stored + kDigestSize;
      const size_t sig_len = get_le(block, 2);
      if (sig_len == 0 || sig_len > kCheckpointSignatureSlot ||
          std::any_of(block + 2 + sig_len, block + kSignatureBlock,
                      [](uint8_t b) { return b != 0; })) {
        return at + "malformed signature block: the checkpoint is corrupt";
      }
      const std::vector<uint8_t> sig(block + 2, block + 2 + sig_len);
      if (auto bad = check.verifier->verify(cert, kCheckpointDomain, stored, kDigestSize, sig,
                                            check.signer)) {
        return at + "its signature does not verify: " + *bad;
      }
    }
    if (out) *out = std::move(id);
    return std::nullopt;
  }

 private:
  uint64_t total_;
  uint64_t offset_ = 0;
  std::vector<uint8_t> head_;
  std::vector<uint8_t> tail_;  // the last bytes fed, not hashed yet
  Sha256 hash_;
};

// "round-<r>.fwck" with r in canonical decimal; anything else is not a replica.
bool parse_replica_name(const std::string& name, uint64_t* round) {
  const std::string prefix = "round-", suffix = ".fwck";
  if (name.size() <= prefix.size() + suffix.size()) return false;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size() - suffix.size();
  const auto [end, ec] = std::from_chars(first, last, *round);
  return ec == std::errc() && end == last && name == prefix + std::to_string(*round) + suffix;
}

}  // namespace

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

struct CheckpointAssembly::State {
  fs::path target;
  std::string node;
  Sha256Digest digest;
  uint64_t round;
  uint32_t count;
  uint64_t total;
  StreamCheck check;
  CheckpointSignerCheck signer;
  uint32_t next = 0;
  uint64_t received = 0;
  bool over = false;                        // done or failed: no more pieces
  std::unique_ptr<AtomicFileWriter> out{};  // opened by piece 0
  Sha256 whole{};
  std::string sha_hex{};
};

CheckpointAssembly::CheckpointAssembly(fs::path target, std::string expected_node,
                                       std::array<uint8_t, 32> topology_digest, uint64_t round,
                                       uint32_t count, uint64_t total, CheckpointSignerCheck signer)
    : s_(new State{std::move(target), std::move(expected_node), topology_digest, round, count,
                   total, StreamCheck(total), std::move(signer)}) {}
CheckpointAssembly::~CheckpointAssembly() = default;
CheckpointAssembly::CheckpointAssembly(CheckpointAssembly&&) noexcept = default;
CheckpointAssembly& CheckpointAssembly::operator=(CheckpointAssembly&&) noexcept = default;

uint64_t CheckpointAssembly::round() const { return s_->round; }
uint64_t CheckpointAssembly::received() const { return s_->received; }
const std::string& CheckpointAssembly::sha256_hex() const { return s_->sha_hex; }

CheckpointAssembly::Status CheckpointAssembly::add(uint32_t index, uint32_t count, uint64_t round,
                                                   uint64_t total, const uint8_t* data, size_t n,
                                                   std::string* why) {
  State& s = *s_;
  const auto fail = [&](const std::string& reason) {
    s.over = true;
    s.out.reset();  // removes the temporary file
    if (why) *why = reason;
    return Status::kFailed;
  };
  const std::string at = "transfer of checkpoint " + s.target.string() + ": ";
  const auto num = [](uint64_t v) { return std::to_string(v); };
  if (s.over) return fail(at + (s.sha_hex.empty() ? "already failed" : "already complete"));
  if (count != s.count || round != s.round || total != s.total) {
    return fail(at + "piece " + num(index) + " announces round " + num(round) + ", " + num(count) +
                " pieces, " + num(total) + " bytes; the transfer is round " + num(s.round) + ", " +
                num(s.count) + " pieces, " + num(s.total) + " bytes");
  }
  if (s.count == 0 || s.count > s.total) {
    return fail(at + num(s.count) + " pieces cannot carry " + num(s.total) + " bytes");
  }
  if (index != s.next) {
    return fail(at + "piece " + num(index) + " arrived, expected piece " + num(s.next));
  }
  if (n == 0 || data == nullptr) return fail(at + "piece " + num(index) + " is empty");
  const bool last = index + 1 == s.count;
  if (n > s.total - s.received || (last && s.received + n != s.total)) {
    return fail(at + "the pieces hold " + (last ? "" : "over ") + num(s.received + n) +
                " bytes, the file was announced as " + num(s.total));
  }
  try {
    if (!s.out) s.out = std::make_unique<AtomicFileWriter>(s.target, kReplicaMode);
    s.out->write(data, n);
    s.check.feed(data, n);
    s.whole.update(data, n);
    s.received += n;
    ++s.next;
    if (!last) return Status::kMore;
    CheckpointIdentity id;
    std::optional<std::string> bad = s.check.finish(s.target, s.node, s.digest, &id, s.signer);
    if (!bad && id.round != s.round) {
      bad = "checkpoint " + s.target.string() + ": holds round " + num(id.round) +
            ", announced as round " + num(s.round);
    }
    if (bad) return fail(*bad);
    s.out->commit(/*require_durable_rename=*/true);
    s.out.reset();
    const Sha256Digest d = s.whole.finish();
    s.sha_hex = to_hex(d.data(), d.size());
    s.over = true;
    return Status::kDone;
  } catch (const std::exception& e) {
    return fail(at + e.what());
  }
}

ReplicaStore::ReplicaStore(fs::path dir, std::array<uint8_t, 32> topology_digest, size_t keep,
                           std::shared_ptr<const security::SignatureVerifier> verifier,
                           std::string job)
    : dir_(std::move(dir)),
      digest_(topology_digest),
      keep_(keep),
      verifier_(std::move(verifier)),
      job_(std::move(job)) {
  if (keep_ == 0) {
    throw ConfigError("replica store " + dir_.string() +
                      ": keep must be at least 1 replica per child");
  }
}
ReplicaStore::~ReplicaStore() = default;

fs::path ReplicaStore::replica_path(const std::string& child, uint64_t round) const {
  return dir_ / child / ("round-" + std::to_string(round) + ".fwck");
}

ReplicaStore::Result ReplicaStore::add_piece(const std::string& child, uint64_t round,
                                             uint32_t index, uint32_t count, uint64_t total,
                                             const uint8_t* data, size_t n) {
  Result r;
  r.round = round;
  const auto refuse = [&](std::string detail) {
    pending_.erase(child);
    r.kind = Result::Kind::kRefused;
    r.detail = std::move(detail);
    return r;
  };
  if (!is_valid_node_id(child)) {
    return refuse("replica from child '" + child +
                  "' refused: a node id is 1..64 characters of [A-Za-z0-9._-]");
  }
  try {
    if (index == 0) {
      pending_.erase(child);
      const std::vector<uint64_t> have = rounds(child);
      if (have.size() >= keep_ && round < have[have.size() - keep_]) {
        return refuse("replica of '" + child + "' round " + std::to_string(round) +
                      " refused: older than the " + std::to_string(keep_) +
                      " replicas kept (oldest kept: round " +
                      std::to_string(have[have.size() - keep_]) + ")");
      }
      make_private_directory(dir_);
      make_private_directory(dir_ / child);
      pending_[child] = std::make_unique<CheckpointAssembly>(
          replica_path(child, round), child, digest_, round, count, total, signer_check(child));
    }
    const auto it = pending_.find(child);
    if (it == pending_.end()) {
      return refuse("replica of '" + child + "': piece " + std::to_string(index) +
                    " arrived with no transfer in progress (piece 0 starts one)");
    }
    std::string why;
    switch (it->second->add(index, count, round, total, data, n, &why)) {
      case CheckpointAssembly::Status::kMore: r.bytes = it->second->received(); return r;
      case CheckpointAssembly::Status::kFailed: return refuse(why);
      case CheckpointAssembly::Status::kDone: break;
    }
    r.kind = Result::Kind::kStored;
    r.bytes = total;
    r.sha256_hex = it->second->sha256_hex();
    r.path = replica_path(child, round);
    pending_.erase(it);
    prune(child);
    return r;
  } catch (const std::exception& e) {
    return refuse(e.what());
  }
}

void ReplicaStore::abandon(const std::string& child) { pending_.erase(child); }

CheckpointSignerCheck ReplicaStore::signer_check(const std::string& child) const {
  CheckpointSignerCheck c;
  c.verifier = verifier_;
  c.signer.node_id = child;
  c.signer.job = job_;
  return c;
}

void ReplicaStore::prune(const std::string& child) {
  const std::vector<uint64_t> have = rounds(child);
  for (size_t i = 0; i + keep_ < have.size(); ++i) {
    std::error_code ec;
    fs::remove(replica_path(child, have[i]), ec);
    if (ec) {
      log().warn("[replicas] cannot remove old replica {}: {}",
                 replica_path(child, have[i]).string(), ec.message());
    }
  }
}

std::optional<fs::path> ReplicaStore::latest(const std::string& child) {
  const std::vector<uint64_t> have = rounds(child);
  for (auto it = have.rbegin(); it != have.rend(); ++it) {
    const fs::path p = replica_path(child, *it);
    CheckpointIdentity id;
    std::optional<std::string> bad =
        check_checkpoint_stream(p, child, digest_, &id, signer_check(child));
    if (!bad && id.round != *it) {
      bad = "checkpoint " + p.string() + " holds round " + std::to_string(id.round) +
            ", its name says " + std::to_string(*it);
    }
    if (!bad) return p;
    log().warn("[replicas] {}; keeping it as {}.corrupt", *bad, p.filename().string());
    std::error_code ec;
    fs::rename(p, fs::path(p.string() + ".corrupt"), ec);
    if (ec) log().warn("[replicas] cannot rename {}: {}", p.string(), ec.message());
  }
  return std::nullopt;
}

std::vector<uint64_t> ReplicaStore::rounds(const std::string& child) const {
  std::vector<uint64_t> out;
  if (!is_valid_node_id(child)) return out;
  std::error_code ec;
  for (fs::directory_iterator it(dir_ / child, ec), end; !ec && it != end; it.increment(ec)) {
    uint64_t round = 0;
    if (parse_replica_name(it->path().filename().string(), &round)) out.push_back(round);
  }
  std::sort(out.begin(), out.end());
  return out;
}

PieceReader::PieceReader(const fs::path& path, uint32_t piece_bytes)
    : path_(path), piece_bytes_(piece_bytes) {
  if (piece_bytes_ == 0) {
    throw ConfigError("piece size for sending " + path_.string() + " must be at least 1 byte");
  }
  Fd f{::open(path_.c_str(), O_RDONLY | O_CLOEXEC)};  // closed if we throw
  const std::string what = "cannot send " + path_.string() + ": ";
  if (f.fd < 0) throw TransportError(what + errno_text(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw TransportError(what + errno_text(errno));
  if (!S_ISREG(st.st_mode)) throw TransportError(what + "not a regular file");
  if (st.st_size == 0) throw TransportError(what + "the file is empty");
  size_ = static_cast<uint64_t>(st.st_size);
  const uint64_t pieces = (size_ - 1) / piece_bytes_ + 1;
  if (pieces > std::numeric_limits<uint32_t>::max()) {
    throw ConfigError(what + "pieces of " + std::to_string(piece_bytes_) +
                      " bytes would be over 2^32-1 of them: use larger pieces");
  }
  count_ = static_cast<uint32_t>(pieces);
  fd_ = std::exchange(f.fd, -1);
}

PieceReader::~PieceReader() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<uint8_t> PieceReader::next() {
  if (done()) {
    throw TransportError("all " + std::to_string(count_) + " pieces of " + path_.string() +
                         " were already read");
  }
  const uint64_t offset = uint64_t{next_} * piece_bytes_;
  std::vector<uint8_t> piece(static_cast<size_t>(std::min<uint64_t>(piece_bytes_, size_ - offset)));
  for (size_t got = 0; got < piece.size();) {
    const ssize_t r =
        ::pread(fd_, piece.data() + got, piece.size() - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw TransportError("cannot read " + path_.string() + ": " + errno_text(errno));
    if (r == 0) {
      throw TransportError(path_.string() + " shrank below " + std::to_string(size_) +
                           " bytes while being sent; send it again");
    }
    got += static_cast<size_t>(r);
  }
  ++next_;
  return piece;
}

}  // namespace fedwan::checkpoint
