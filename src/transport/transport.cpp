#include "transport/transport.hpp"

#include "transport/mem_transport.hpp"
#include "transport/zmq_transport.hpp"

namespace fedwan::transport {

Message::Message(std::vector<uint8_t> bytes) {
  auto owner = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  data_ = owner->data();
  size_ = owner->size();
  owner_ = std::move(owner);
}

bool is_mem_endpoint(const std::string& endpoint) { return endpoint.rfind("mem://", 0) == 0; }

std::unique_ptr<Transport> make_transport(const std::string& endpoint) {
  return is_mem_endpoint(endpoint) ? make_mem_transport() : make_zmq_transport();
}

}  // namespace fedwan::transport
