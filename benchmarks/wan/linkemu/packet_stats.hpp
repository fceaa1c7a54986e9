// What crossed one direction of an emulated link, counted from the packets
// themselves: IP packets and bytes, the TCP payload in them, and how much of
// that payload was sent before (a retransmission: its sequence numbers lie
// below the highest one already seen on its connection). The payload bytes
// that were new are what the sending application wrote to its socket, which
// is what the harness compares with fedwan's own byte counters.
//
// Thread safety: none; owned by the emulator's event loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>

namespace fedwan::linkemu {

// The fields of an IPv4 packet the emulator looks at. parse() returns false
// for anything that is not a well-formed IPv4 packet.
struct PacketInfo {
  uint32_t src = 0;  // host byte order
  uint32_t dst = 0;
  uint8_t protocol = 0;
  bool tcp = false;
  uint16_t sport = 0;
  uint16_t dport = 0;
  uint32_t seq = 0;
  uint32_t payload = 0;  // TCP payload bytes
  bool syn = false;
  bool fin = false;
  static bool parse(const uint8_t* p, size_t n, PacketInfo* out);
};

struct DirectionCounters {
  uint64_t packets = 0;
  uint64_t bytes = 0;  // IP packets, headers included
  uint64_t tcp_payload = 0;
  uint64_t tcp_retransmitted = 0;  // of tcp_payload
  uint64_t lost = 0;               // dropped by the loss model
  uint64_t queue_drops = 0;        // dropped by a full bottleneck queue
  uint64_t duplicated = 0;
  uint64_t reordered = 0;
  uint64_t lost_bytes = 0;
  uint64_t queue_drop_bytes = 0;
};

class PacketStats {
 public:
  // A packet offered to the link (before loss or queueing).
  void offered(const PacketInfo& info, uint32_t bytes);
  DirectionCounters& counters() { return c_; }
  const DirectionCounters& counters() const { return c_; }

 private:
  struct Flow {
    uint32_t next = 0;  // highest sequence number seen + 1
    bool started = false;
  };
  DirectionCounters c_;
  std::unordered_map<uint64_t, Flow> flows_;  // keyed by the two ports and the src address
};

}  // namespace fedwan::linkemu
