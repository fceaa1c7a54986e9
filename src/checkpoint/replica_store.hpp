// Checkpoint replication between a node and its parent aggregator. A node
// sends its latest checkpoint file (checkpoint_file.hpp format) as raw pieces
// read by PieceReader; the parent streams them to disk with a
// CheckpointAssembly and keeps the newest few per child in a ReplicaStore. A
// node whose own checkpoint is lost gets a replica streamed back and installs
// it with a CheckpointAssembly aimed at its checkpoint path.
//
// Memory stays bounded by one piece (plus a 1 MiB read buffer when checking a
// stored file): no file is ever held whole. A received file replaces its
// target only once complete and verified (magic, version, flags, node id,
// topology digest, round and the trailing SHA-256), so a bad transfer never
// clobbers a good file.
//
// Errors: bad input from a peer (pieces out of order, sizes that do not add
// up, a foreign or damaged file) and disk failures while receiving are return
// values (kFailed / kRefused with a reason naming the path), never exceptions.
// PieceReader throws TransportError for a file it cannot open or read and
// ConfigError for a piece size that cannot describe the file.
// Thread safety: none of the classes is thread safe (one owner, e.g. the
// aggregator's event loop); distinct objects share no state. All calls block
// on the disk.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_file.hpp"

namespace fedwan::checkpoint {

struct CheckpointIdentity {
  uint64_t round = 0;
  std::array<uint8_t, 32> topology_digest{};
  std::string node_id;
  // The checkpoint's own digest, as its trailer holds it and its signature
  // covers: the SHA-256 of its header and manifest (which names every
  // section's SHA-256) from version 3, of every byte before the trailer
  // before. It names the file's contents as a SHA-256 of the whole file
  // would, without hashing its sections a second time.
  std::array<uint8_t, 32> digest{};
  bool is_signed = false;  // it carries a signature (checked only when asked)
};

// Streaming check of the checkpoint at `path` without loading it: the fixed
// header (magic, version, flags, node id rule), the manifest digest over
// every byte before it, that the file is `expected_node`'s under
// `expected_digest`, and, when `check` has a verifier, its signature.
// Reads in 1 MiB pieces. nullopt when intact and matching (and *out filled
// when given); otherwise a reason naming the path. The sections and manifest
// are not parsed: read_checkpoint does that.
std::optional<std::string> check_checkpoint_stream(const std::filesystem::path& path,
                                                   const std::string& expected_node,
                                                   const std::array<uint8_t, 32>& expected_digest,
                                                   CheckpointIdentity* out = nullptr,
                                                   const CheckpointSignerCheck& check = {});
// The same check of the file's integrity whoever's it is (`fedwan
// checkpoint digest`): nullopt and *out filled when intact. Its signature,
// if any, is not checked.
std::optional<std::string> check_checkpoint_integrity(const std::filesystem::path& path,
                                                      CheckpointIdentity* out);

// Receives one checkpoint file of `total` bytes in `count` pieces, in order
// 0..count-1, into `target`. Pieces go straight to a temporary file beside
// `target` (mode 0600; its directory must exist) while being hashed; the last
// piece verifies the whole (as check_checkpoint_stream, plus the announced
// round), then renames it over `target` and fsyncs the directory. A failed
// assembly removes its temporary file and stays failed. Movable; a moved-from
// assembly may only be destroyed or assigned to.
class CheckpointAssembly {
 public:
  // With a verifier in `signer`, the file must carry that signer's signature.
  CheckpointAssembly(std::filesystem::path target, std::string expected_node,
                     std::array<uint8_t, 32> topology_digest, uint64_t round, uint32_t count,
                     uint64_t total, CheckpointSignerCheck signer = {});
  ~CheckpointAssembly();
  CheckpointAssembly(CheckpointAssembly&&) noexcept;
  CheckpointAssembly& operator=(CheckpointAssembly&&) noexcept;

  enum class Status { kMore, kDone, kFailed };
  // Never throws: a piece out of order, empty, past `total` or announcing
  // another round/count/total, a file that fails verification, or a disk
  // error gives kFailed with *why (if given) set. Any call after kDone or
  // kFailed is kFailed.
  [[nodiscard]] Status add(uint32_t index, uint32_t count, uint64_t round, uint64_t total,
                           const uint8_t* data, size_t n, std::string* why);

  uint64_t round() const;
  uint64_t received() const;  // bytes accepted so far
  // Lower-case hex of the file's digest (CheckpointIdentity::digest); empty
  // before kDone.
  const std::string& digest_hex() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// The parent's replicas of its children's checkpoints: <dir>/<child>/
// round-<r>.fwck, directories created 0700, files 0600. Other names in a
// child's directory (temporaries, *.corrupt kept for the operator) are
// ignored. At most one unfinished assembly per child is kept in memory.
class ReplicaStore {
 public:
  // keep >= 1 (ConfigError otherwise): replicas kept per child. With a
  // verifier, a replica is kept (and served) only when its child of `job`
  // signed it; without, integrity is checked (nodes without credentials).
  ReplicaStore(std::filesystem::path dir, std::array<uint8_t, 32> topology_digest, size_t keep = 2,
               std::shared_ptr<const security::SignatureVerifier> verifier = nullptr,
               std::string job = "");
  ~ReplicaStore();

  struct Result {
    enum class Kind { kPartial, kStored, kRefused } kind = Kind::kPartial;
    uint64_t round = 0;
    uint64_t bytes = 0;      // received so far; the file size when stored
    std::string digest_hex;  // of the stored file (CheckpointIdentity::digest)
    std::filesystem::path path;
    std::string detail;  // why refused
  };

  // One piece of `child`'s checkpoint for `round`. Index 0 starts a new
  // assembly (dropping an unfinished one of that child); a round older than
  // the `keep` newest stored is refused there, as pruning would drop it at
  // once. A piece that does not continue the child's assembly is refused and
  // the assembly dropped. The last piece stores round-<r>.fwck (replacing
  // that round) and deletes the oldest replicas beyond `keep`. An invalid
  // node id (common/node_id.hpp; it becomes a path) is refused. Never throws.
  Result add_piece(const std::string& child, uint64_t round, uint32_t index, uint32_t count,
                   uint64_t total, const uint8_t* data, size_t n);
  void abandon(const std::string& child);  // drops an unfinished assembly
  // The most bytes one replica may announce; 0: no limit. A transfer that
  // announces more is refused at its first piece, before anything is
  // written: a child cannot fill this node's disk with a file it never
  // finishes.
  void set_max_bytes(uint64_t max_bytes) { max_bytes_ = max_bytes; }
  uint64_t max_bytes() const { return max_bytes_; }

  // The newest replica of `child` that passes check_checkpoint_stream (and
  // holds the round its name says); one that fails is renamed *.corrupt,
  // logged, and the next older tried. nullopt: none.
  std::optional<std::filesystem::path> latest(const std::string& child);
  std::vector<uint64_t> rounds(const std::string& child) const;  // ascending
  // What a replica of `child` must be signed by (no verifier: integrity only).
  CheckpointSignerCheck signer_check(const std::string& child) const;

 private:
  std::filesystem::path replica_path(const std::string& child, uint64_t round) const;
  void prune(const std::string& child);

  std::filesystem::path dir_;
  std::array<uint8_t, 32> digest_;
  size_t keep_;
  std::shared_ptr<const security::SignatureVerifier> verifier_;
  std::string job_;
  uint64_t max_bytes_ = 0;
  std::map<std::string, std::unique_ptr<CheckpointAssembly>> pending_;
};

// Reads a file as pieces for sending. The file stays open, so renaming or
// replacing the path afterwards (write_checkpoint does) does not change what
// is sent; size() is taken at construction. Not copyable.
class PieceReader {
 public:
  // TransportError naming the path when it cannot be opened, is not a regular
  // file or is empty; ConfigError when piece_bytes is 0 or the file needs more
  // than 2^32-1 pieces.
  PieceReader(const std::filesystem::path& path, uint32_t piece_bytes);
  ~PieceReader();
  PieceReader(const PieceReader&) = delete;
  PieceReader& operator=(const PieceReader&) = delete;

  uint64_t size() const { return size_; }
  uint32_t count() const { return count_; }  // ceil(size / piece_bytes) >= 1
  uint32_t next_index() const { return next_; }
  bool done() const { return next_ >= count_; }
  void rewind() { next_ = 0; }  // the file as it was opened, from its first piece
  // The next piece (piece_bytes long but the last). TransportError on a read
  // failure, a file truncated in place, or when done().
  std::vector<uint8_t> next();

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  uint32_t piece_bytes_;
  uint64_t size_ = 0;
  uint32_t count_ = 0;
  uint32_t next_ = 0;
};

}  // namespace fedwan::checkpoint
