// A checkpoint's "meta" section: the JSON object a node records beside its
// arrays (its round bookkeeping, data position, audit head, membership).
#pragma once

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_file.hpp"

namespace fedwan::checkpoint {

inline constexpr const char* kMetaSection = "meta";

// The "meta" section parsed, read from disk when it was left there; an empty
// object when there is none or it is not a JSON object (a checkpoint's
// integrity is read_checkpoint's to check, its meaning the caller's).
nlohmann::json checkpoint_meta(const Checkpoint& c);

}  // namespace fedwan::checkpoint
