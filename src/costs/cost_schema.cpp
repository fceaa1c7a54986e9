#include "costs/cost_schema.hpp"

namespace fedwan::costs {

std::string cost_record_signed_text(nlohmann::json record) {
  record.erase("sig");
  record.erase("cert");
  return record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace fedwan::costs
