// A TUN device inside a named network namespace: the emulator's end of one
// emulated host. The device is created from inside the namespace (setns),
// given the host's address and brought up there; the returned descriptor
// works from any namespace, and the device disappears when it is closed.
//
// Needs CAP_NET_ADMIN (root) and /dev/net/tun. Errors throw
// std::runtime_error naming the namespace, the device and the system call.
#pragma once

#include <cstdint>
#include <string>

namespace fedwan::linkemu {

struct TunSpec {
  std::string netns;  // a name under /var/run/netns, or an absolute path
  std::string device = "fwe0";
  std::string address;  // dotted IPv4
  int prefix_len = 16;
  int mtu = 1500;
  int txqueuelen = 10000;
};

// An open, non-blocking TUN descriptor (IFF_TUN | IFF_NO_PI: raw IP packets).
class TunDevice {
 public:
  explicit TunDevice(const TunSpec& spec);
  ~TunDevice();
  TunDevice(const TunDevice&) = delete;
  TunDevice& operator=(const TunDevice&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// Whether this process may create TUN devices in namespaces (root,
// /dev/net/tun present); otherwise why not.
std::string tun_unavailable_reason();

// Parses dotted IPv4 into host byte order; throws std::invalid_argument.
uint32_t parse_ipv4(const std::string& text);

}  // namespace fedwan::linkemu
