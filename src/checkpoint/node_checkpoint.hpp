// A node's checkpoints on local disk: <dir>/<node>.fwck (the latest) and
// <dir>/<node>.prev.fwck (the one before), in the checkpoint_file.hpp format.
// Saving moves the latest aside, then writes the new one atomically, so a
// crash at any point leaves at least one intact checkpoint. Loading takes the
// latest that verifies; a corrupt file is renamed *.corrupt (kept for the
// operator) and reported, never used. Blocks on the disk; not thread safe.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_file.hpp"
#include "checkpoint/replica_image.hpp"
#include "fedwan/topology.hpp"

namespace fedwan::node {
class NodeSecurity;
}  // namespace fedwan::node

namespace fedwan::checkpoint {

using node::NodeSecurity;

// Who signs a node's checkpoints and what a checkpoint it reads must be: a
// node with credentials signs with its key and accepts only checkpoints its
// own identity signed; one without signs nothing and checks integrity only.
struct CheckpointTrust {
  std::shared_ptr<const security::NodeKey> key;
  CheckpointSignerCheck check;
};
CheckpointTrust checkpoint_trust(const NodeSecurity& security, const Topology& topo,
                                 const NodeSpec& self);

std::filesystem::path checkpoint_path(const std::filesystem::path& dir, const std::string& node);
// <dir>/<node>.replica.fwck: the replica image (replica_image.hpp) of the
// latest checkpoint, what goes to the parent.
std::filesystem::path replica_image_path(const std::filesystem::path& dir, const std::string& node);

// Each section's SHA-256 in the order of the checkpoint's sections
// (write_checkpoint); section_digest finds one by name (nullptr: none).
using SectionDigests = std::vector<std::array<uint8_t, 32>>;
const std::array<uint8_t, 32>* section_digest(const Checkpoint& c, const SectionDigests& digests,
                                              std::string_view name);

// Writes `c` as the node's latest checkpoint (creating `dir`, mode 0700),
// signed with trust.key when there is one; returns its sections' digests.
SectionDigests save_node_checkpoint(const std::filesystem::path& dir, const Checkpoint& c,
                                    const CheckpointTrust& trust = {});

// Writes the replica image of `c` (replica_image.hpp, with `plan`) to
// replica_image_path, signed like the node's checkpoints, and returns its
// size in bytes. `base_sha256`: the base section's digest when the caller
// has it (from save_node_checkpoint of the same `c`), else it is computed.
uint64_t save_replica_image(const std::filesystem::path& dir, const Checkpoint& c,
                            const ReplicaPlan& plan, const CheckpointTrust& trust = {},
                            const std::array<uint8_t, 32>* base_sha256 = nullptr);

struct LoadedCheckpoint {
  Checkpoint checkpoint;
  std::filesystem::path path;
  std::vector<std::string> problems;  // files refused on the way (corrupt)
};

// Sections of a whole checkpoint this big or bigger are left in the file by
// load_node_checkpoint (CheckpointSection::stored).
inline constexpr uint64_t kRestoreOnDiskFrom = uint64_t{1} << 20;

// The node's newest intact checkpoint that passes trust.check, or nullopt
// when there is none (the problems met are logged; a refused file is kept
// as *.corrupt). Throws ConfigError when an intact checkpoint belongs to
// another node or topology: resuming it would be a silent error. Sections
// of kRestoreOnDiskFrom bytes or more are verified and left in the file, so
// the caller reads the model straight into place (copy_floats,
// read_section; an image's by expand_replica_section) with no copy of it
// beside.
std::optional<LoadedCheckpoint> load_node_checkpoint(const std::filesystem::path& dir,
                                                     const Topology& topo, const std::string& node,
                                                     const CheckpointTrust& trust = {});

// A checkpoint records the audit log's head (its "meta" section's audit_seq
// and audit_hash): after a resume, the node's audit log must still hold it,
// or the node raises the audit_truncated alarm (NodeSecurity).
void check_recorded_audit_head(const Checkpoint& c, NodeSecurity& security);

// A section of n fp32 values (little-endian, as in memory) that views
// `data` rather than copying it: the values must stay valid and unchanged
// until the checkpoint is written, so a checkpoint of the model costs no
// second copy of it in memory.
CheckpointSection float_section(std::string name, const float* data, size_t n);
// A section that owns its bytes.
inline CheckpointSection bytes_section(std::string name, std::vector<uint8_t> bytes) {
  CheckpointSection s;
  s.name = std::move(name);
  s.bytes = std::move(bytes);
  return s;
}
// The section's floats (from memory or its file); throws CryptoError naming
// the section when it is missing or does not hold exactly `n` floats (n = 0:
// any length), or as read_section.
std::vector<float> floats_of(const Checkpoint& c, const std::string& name, size_t n = 0);
// The section's n floats copied to `out` (from memory or its file); throws
// CryptoError naming the section, leaving `out` as it was, when it is
// missing or does not hold exactly n floats; or as read_section, with part
// of `out` written.
void copy_floats(const Checkpoint& c, const std::string& name, float* out, size_t n);

}  // namespace fedwan::checkpoint
