#include "checkpoint/checkpoint_meta.hpp"

#include <cstdint>
#include <vector>

namespace fedwan::checkpoint {

nlohmann::json checkpoint_meta(const Checkpoint& c) {
  const CheckpointSection* m = c.find(kMetaSection);
  if (m == nullptr) return nlohmann::json::object();
  std::vector<uint8_t> copy;
  const uint8_t* p = nullptr;
  if (m->on_disk()) {
    copy = section_bytes(*m);
    p = copy.data();
  } else {
    p = m->data();
  }
  nlohmann::json j = nlohmann::json::parse(p, p + m->size(), nullptr, false);
  return j.is_object() ? j : nlohmann::json::object();
}

}  // namespace fedwan::checkpoint
