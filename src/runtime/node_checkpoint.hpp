// A node's checkpoints on local disk: <dir>/<node>.fwck (the latest) and
// <dir>/<node>.prev.fwck (the one before), in the checkpoint_file.hpp format.
// Saving moves the latest aside, then writes the new one atomically, so a
// crash at any point leaves at least one intact checkpoint. Loading takes the
// latest that verifies; a corrupt file is renamed *.corrupt (kept for the
// operator) and reported, never used. Blocks on the disk; not thread safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "fedwan/topology.hpp"
#include "runtime/checkpoint_file.hpp"

namespace fedwan::runtime {

std::filesystem::path checkpoint_path(const std::filesystem::path& dir, const std::string& node);

// Writes `c` as the node's latest checkpoint (creating `dir`, mode 0700).
void save_node_checkpoint(const std::filesystem::path& dir, const Checkpoint& c);

struct LoadedCheckpoint {
  Checkpoint checkpoint;
  std::filesystem::path path;
  std::vector<std::string> problems;  // files refused on the way (corrupt)
};

// The node's newest intact checkpoint, or nullopt when there is none (the
// problems met are logged). Throws ConfigError when an intact checkpoint
// belongs to another node or topology: resuming it would be a silent error.
std::optional<LoadedCheckpoint> load_node_checkpoint(const std::filesystem::path& dir,
                                                     const Topology& topo,
                                                     const std::string& node);

// Sections holding fp32 vectors (little-endian, as in memory).
CheckpointSection float_section(std::string name, const float* data, size_t n);
// The section's floats; throws CryptoError naming the section when it is
// missing or does not hold exactly `n` floats (n = 0: any length).
std::vector<float> floats_of(const Checkpoint& c, const std::string& name, size_t n = 0);

}  // namespace fedwan::runtime
