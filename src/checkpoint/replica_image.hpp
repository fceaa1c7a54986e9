// A node's replica image: what its parent keeps of the node's checkpoint,
// without what the parent can rebuild itself. The parent sent the node the
// anchor of its round, so the image leaves that out and carries the rest
// small:
//   - the base section (the anchor) is left out; the image names it and
//     its SHA-256;
//   - fp32 sections close to the base (a site's parameters) are stored as
//     their bits XOR the base's, zstd-compressed: lossless, and next to
//     nothing when they equal the anchor;
//   - fp32 sections kept to bf16 (the error-feedback residual, itself a
//     rounding error) are rounded to nearest-even bf16 and compressed:
//     lossy by at most 2^-8 of each value;
//   - every other section (meta aside) is zstd-compressed.
// The image is an ordinary checkpoint file (checkpoint_file.hpp), signed by
// the node like its own checkpoints; its "meta" section is the checkpoint's
// meta plus "replica" {"base", "base_sha256", "sections": [{"name",
// "encoding", "bytes"}]}, in section order. Restoring it takes the anchor of
// its round, from the parent's model (expand_replica_image).
//
// Reading an image takes its sections in memory or still in their file
// (read_checkpoint's CheckpointReadOptions): each is decoded as it streams
// from there, so the compressed image is never held whole.
//
// Errors: make_replica_image throws ConfigError when the checkpoint lacks
// the base or a listed section does not match it in size. Reading an image
// (expand_replica_image, replica_base_sha256) throws CryptoError for any
// content that does not decode as declared, naming the section, and for a
// section left in its file that changed there since it was verified; the
// caller's buffer may then hold part of the decode.
// Thread safety: pure functions.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_file.hpp"

namespace fedwan::checkpoint {

struct ReplicaPlan {
  std::string base;                        // the fp32 section the parent rebuilds ("anchor")
  std::vector<std::string> xor_sections;   // fp32 sections stored as XOR of the base
  std::vector<std::string> bf16_sections;  // fp32 sections kept to bf16
  // Sections that hold bf16 values already (a residual kept in bf16),
  // stored in the same two byte planes.
  std::vector<std::string> bf16_held_sections;
};

// The image of `c` (its sections may be views). Its sections are made
// while write_checkpoint writes them (CheckpointSection::produce): they
// read c's sections' bytes, which must stay valid and unchanged until then
// (materialize() makes them bytes). Memory: a working buffer of a few
// hundred KiB; neither the image nor any copy of the model. `base_sha256`:
// the base section's SHA-256 when the caller has it (the checkpoint of `c`
// just written hashed it), else the base is hashed here.
Checkpoint make_replica_image(const Checkpoint& c, const ReplicaPlan& plan,
                              const std::array<uint8_t, 32>* base_sha256 = nullptr);
Checkpoint make_replica_image(Checkpoint&& c, const ReplicaPlan& plan,
                              const std::array<uint8_t, 32>* base_sha256 = nullptr) =
    delete;  // would dangle

// True when `c` is an image rather than a whole checkpoint.
bool is_replica_image(const Checkpoint& c);

// The SHA-256 of the base an image was made against (of its fp32 bytes).
std::array<uint8_t, 32> replica_base_sha256(const Checkpoint& image);

// The whole checkpoint the image was made of, with `base` (n floats, which
// must hash to replica_base_sha256) as its base section, a view of `base`
// (which must outlive the result); the sections kept to bf16 come back as
// fp32. Its meta has no "replica" entry. Without a base
// (nullptr), the base and the sections stored against it are left out.
Checkpoint expand_replica_image(const Checkpoint& image, const float* base, size_t n);

// The image's sections besides its meta, in order.
std::vector<std::string> replica_section_names(const Checkpoint& image);

// The bytes the image's section `name` decodes to; nullopt when it holds
// none.
std::optional<uint64_t> replica_section_size(const Checkpoint& image, const std::string& name);
// Decodes the image's section `name` into out[0..out_bytes), which must be
// its decoded size: one array restored in place, with no copy of the
// expanded image. A section stored against the base needs `base` (n
// floats hashing to replica_base_sha256). Throws CryptoError as
// expand_replica_image, and when the section is missing or of another size
// (before writing to `out`).
void expand_replica_section(const Checkpoint& image, const std::string& name, const float* base,
                            size_t n, uint8_t* out, size_t out_bytes);

}  // namespace fedwan::checkpoint
