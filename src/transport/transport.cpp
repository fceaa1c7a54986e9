#include "transport/transport.hpp"

#include <mutex>

#include "transport/mem_transport.hpp"
#include "transport/zmq_transport.hpp"

namespace fedwan::transport {

Message::Message(std::vector<uint8_t> bytes) {
  auto owner = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  data_ = owner->data();
  size_ = owner->size();
  owner_ = std::move(owner);
}

namespace {

// Never destroyed: threads still running at exit may make transports.
struct DecoratorHook {
  std::mutex mu;
  TransportDecorator decorator;

  static DecoratorHook& get() {
    static DecoratorHook* hook = new DecoratorHook;
    return *hook;
  }
};

}  // namespace

bool is_mem_endpoint(const std::string& endpoint) { return endpoint.rfind("mem://", 0) == 0; }

void set_transport_decorator(TransportDecorator decorator) {
  DecoratorHook& hook = DecoratorHook::get();
  std::lock_guard<std::mutex> lock(hook.mu);
  hook.decorator = std::move(decorator);
}

std::unique_ptr<Transport> make_transport(const std::string& endpoint) {
  std::unique_ptr<Transport> t =
      is_mem_endpoint(endpoint) ? make_mem_transport() : make_zmq_transport();
  TransportDecorator decorate;
  {
    // Called outside the lock: a decorator may make transports of its own.
    DecoratorHook& hook = DecoratorHook::get();
    std::lock_guard<std::mutex> lock(hook.mu);
    decorate = hook.decorator;
  }
  return decorate ? decorate(std::move(t), endpoint) : std::move(t);
}

}  // namespace fedwan::transport
