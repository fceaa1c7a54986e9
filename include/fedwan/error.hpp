// fedwan error hierarchy. Every failure at the API boundary is one of these;
// expected outcomes (would block, stale round, duplicate) are return values.
#pragma once

#include "fedwan/export.hpp"

#include <stdexcept>
#include <string>

namespace fedwan {

class FEDWAN_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Bad configuration or user input: topology, options, flags, model shape.
class FEDWAN_API ConfigError : public Error {
 public:
  using Error::Error;
};

// A peer broke the wire protocol (malformed frame, wrong element count, ...).
class FEDWAN_API ProtocolError : public Error {
 public:
  using Error::Error;
};

// Authentication, encryption or integrity failure.
class FEDWAN_API CryptoError : public Error {
 public:
  using Error::Error;
};

// Socket, connection or I/O failure.
class FEDWAN_API TransportError : public Error {
 public:
  using Error::Error;
};

// A blocking call ran past its timeout.
class FEDWAN_API TimeoutError : public Error {
 public:
  using Error::Error;
};

// A blocking call returned early because stop() was called (SIGTERM
// handling): nothing was sent or counted on the caller's behalf that a
// restart from the node's last checkpoint would send or count again.
class FEDWAN_API StoppedError : public Error {
 public:
  using Error::Error;
};

}  // namespace fedwan

// Throws `type` with the message prefixed by file:line (for internal checks).
#define FEDWAN_THROW(type, msg) \
  throw type(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " + (msg))
