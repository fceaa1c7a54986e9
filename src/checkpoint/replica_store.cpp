#include "checkpoint/replica_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <limits>
#include <system_error>
#include <utility>

#include "checkpoint/checkpoint_file.hpp"
#include "checkpoint/stream_check.hpp"
#include "common/atomic_file.hpp"
#include "common/errno_text.hpp"
#include "common/log.hpp"
#include "common/node_id.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"

namespace fedwan::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr mode_t kReplicaMode = 0600;

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// A parent receives its children's replicas side by side: each transfer's
// write buffer is a quarter of a checkpoint's, so that the buffers of many
// children stay small beside the model (pieces are half a MiB).
constexpr size_t kAssemblyStageBytes = size_t{256} << 10;

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
  std::string digest_hex{};
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
const std::string& CheckpointAssembly::digest_hex() const { return s_->digest_hex; }

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
  if (s.over) return fail(at + (s.digest_hex.empty() ? "already failed" : "already complete"));
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
    if (!s.out)
      s.out = std::make_unique<AtomicFileWriter>(s.target, kReplicaMode, AtomicFileWriter::FailFn{},
                                                 PageCache::kBypass, kAssemblyStageBytes);
    s.out->write(data, n);
    s.check.feed(data, n);
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
    s.digest_hex = to_hex(id.digest.data(), id.digest.size());
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
      if (max_bytes_ > 0 && total > max_bytes_) {
        return refuse("replica of '" + child + "' round " + std::to_string(round) +
                      " refused: it announces " + std::to_string(total) + " bytes, more than the " +
                      std::to_string(max_bytes_) +
                      " this node keeps for one replica (replica_max_bytes)");
      }
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
    r.digest_hex = it->second->digest_hex();
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
