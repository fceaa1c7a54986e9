// The on-disk checkpoint container: named byte sections under a SHA-256
// manifest, replaced atomically, and signed by the node that wrote it. What
// the sections hold (parameters, outer optimizer state, round bookkeeping)
// is up to the fault-tolerance layer.
//
// Layout, all integers little-endian:
//   offset  size  field
//        0     4  magic "FWCK" (the bytes 'F' 'W' 'C' 'K')
//        4     2  version, 3 (versions 1, without signatures, and 2, with the
//                 digest below over the section bytes too, are read)
//        6     2  flags: bit 0 = signed; a reader refuses any other bit
//        8     8  round
//       16    32  topology digest
//       48     2  node id length N, 1..64
//       50     N  node id, [A-Za-z0-9._-] (the common/node_id.hpp rule)
//   signed only:
//              2  certificate length C, 1..kMaxSignerCertBytes
//              C  the signer's certificate, DER
//              4  section count S, 0..256
//   then S manifest entries, in section order:
//              2  name length L, 1..64
//              L  name, [a-z0-9_.-], unique within the file
//              8  byte length of the section
//             32  SHA-256 of the section bytes
//   then the bytes of each section, in order, with nothing between them;
//   then 32 bytes: SHA-256 of every byte before the section bytes (the
//   manifest digest; it covers each section's digest, so every byte is
//   hashed once; version 2: of every byte before it);
//   signed only: 2 bytes signature length G (1..128) and 128 bytes holding
//   the signature (security/node_key.hpp, domain kCheckpointDomain) over
//   the manifest digest, zero-padded.
// The signature is made with the node's own key, so a parent holding the
// file as a replica, or anyone who can write the node's disk, cannot forge
// or alter a checkpoint that passes read_checkpoint with a signer check.
//
// Errors: write_checkpoint throws ConfigError for a checkpoint that cannot be
// encoded (bad node id or section name, duplicate names, too many sections)
// and TransportError when the file system fails. read_checkpoint throws
// TransportError when the file cannot be opened or read (a missing file
// included) and CryptoError for any content that is not a valid, intact
// checkpoint, or not signed by whom the check expects. Every message names
// the path.
// Thread safety: the functions share no state. Writers racing on one path each
// replace the file whole; the last rename wins.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "security/node_key.hpp"

namespace fedwan {

inline constexpr uint16_t kCheckpointVersion = 3;
inline constexpr uint16_t kCheckpointFlagSigned = 1;
inline constexpr const char* kCheckpointDomain = "fedwan-checkpoint-v2";
inline constexpr size_t kCheckpointSignatureSlot = 128;  // signature bytes, zero-padded
inline constexpr size_t kMaxCheckpointSections = 256;
inline constexpr size_t kMaxCheckpointSectionNameLength = 64;

// Where a section left on disk is (checkpoint_file.cpp).
struct StoredSection;

struct CheckpointSection {
  std::string name;            // 1..64 characters of [a-z0-9_.-]
  std::vector<uint8_t> bytes;  // its bytes (what read_checkpoint returns)
  // Or, written without a copy: bytes held elsewhere that stay valid and
  // unchanged until write_checkpoint returns (`bytes` is then ignored).
  const uint8_t* view = nullptr;
  size_t view_size = 0;
  // Or made while write_checkpoint writes it: called once with a sink that
  // takes the section's bytes in order, so no whole copy of them is ever
  // in memory (a compressed image of the model). Whatever it reads must
  // stay valid until write_checkpoint returns. data() and size() are
  // empty until materialize() runs it.
  using Sink = std::function<void(const uint8_t* data, size_t n)>;
  std::function<void(const Sink&)> produce;
  // Or, as read_checkpoint leaves a large section when asked
  // (CheckpointReadOptions): verified, but still in its file, which stays
  // open while the section lives. Its bytes come by read_section or
  // stream_section, read and hashed again; data() throws std::logic_error.
  std::shared_ptr<const StoredSection> stored;
  uint64_t stored_size = 0;

  bool on_disk() const { return stored != nullptr; }
  const uint8_t* data() const {
    if (stored != nullptr) throw_on_disk();
    return view != nullptr ? view : bytes.data();
  }
  size_t size() const {
    if (stored != nullptr) return static_cast<size_t>(stored_size);
    return view != nullptr ? view_size : bytes.size();
  }

 private:
  [[noreturn]] void throw_on_disk() const;
};

struct Checkpoint {
  uint64_t round = 0;
  std::array<uint8_t, 32> topology_digest{};
  std::string node_id;
  std::vector<CheckpointSection> sections;

  // The section called `name`, or nullptr. Valid until `sections` changes.
  const CheckpointSection* find(std::string_view name) const;
};

// True for 1..64 characters of [a-z0-9_.-].
bool is_valid_checkpoint_section_name(std::string_view name);

// Whose signature a checkpoint being read must carry. Without a verifier
// any intact checkpoint passes (a node without credentials); with one, only
// a signed checkpoint whose signer the verifier accepts as `signer`.
struct CheckpointSignerCheck {
  std::shared_ptr<const security::SignatureVerifier> verifier;
  security::ExpectedSigner signer;
};

// Replaces `path` with `c` so that a reader, or a restart after a crash or
// power cut, sees the old checkpoint or the new, never part of either: writes
// a temporary ".<name>.XXXXXX" in the same directory, streaming each section
// from its bytes or its view (no second copy of the data), sets mode 0600, fsyncs it,
// renames it over `path` and fsyncs the directory. Blocks on the disk. On any
// error the temporary file is removed and `path` is left as it was, except
// when only the final directory fsync fails: the new file is then in place
// but may not survive a power cut, and a TransportError says so.
// With `key` the checkpoint is signed by it. The steps of the commit are
// crash points (common/crash_point.hpp) named `<crash_points>.written`,
// `.synced` and `.renamed`.
// Sections with `produce` are written as they are made, and sections left on
// disk are copied from their file (stream_section): their lengths and
// digests go into the manifest once they are written.
// Returns each section's SHA-256, in c.sections' order: a caller that needs
// the digest of a section it just wrote (a replica image's base) has it
// without reading the section again.
std::vector<std::array<uint8_t, 32>> write_checkpoint(const std::filesystem::path& path,
                                                      const Checkpoint& c,
                                                      const security::NodeKey* key = nullptr,
                                                      std::string_view crash_points = "checkpoint");

// Brings every section's bytes into memory: runs each `produce`, reads
// each section left on disk (the checkpoint as read_checkpoint returns it
// without options). Throws like read_section.
void materialize(Checkpoint& c);

struct CheckpointReadOptions {
  // Sections of at least this many bytes are verified but left in the file
  // (CheckpointSection::stored), for the caller to read straight into where
  // they belong: a model restored without a second copy of it in memory.
  uint64_t leave_on_disk_from = UINT64_MAX;
};

// Reads `path` and verifies all of it (magic, version, flags, every length
// against the limits and the file size before anything is allocated, names,
// each section digest, the manifest digest, the signature when `check` has a
// verifier, no trailing bytes). Memory use is bounded by the file's size
// whatever its content, and by the sections kept in memory with `options`.
// Blocks on the disk.
Checkpoint read_checkpoint(const std::filesystem::path& path,
                           const CheckpointSignerCheck& check = {},
                           const CheckpointReadOptions& options = {});

// Passes the section's bytes to `sink` in order, in pieces whose sizes are
// multiples of 4 MiB but for the last: from memory, or read again from its
// file and hashed again. Throws CryptoError when the file's bytes no longer
// hash to what read_checkpoint verified (changed in place since), after the
// sink took some of them: the caller discards what it made. TransportError
// when the file cannot be read. Safe to call from several threads at once.
void stream_section(const CheckpointSection& s, const CheckpointSection::Sink& sink);
// Copies the section's size() bytes to out[0..size()), by stream_section.
void read_section(const CheckpointSection& s, uint8_t* out);
// The section's bytes in memory: a copy, by stream_section.
std::vector<uint8_t> section_bytes(const CheckpointSection& s);

}  // namespace fedwan
