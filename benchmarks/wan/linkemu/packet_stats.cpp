#include "packet_stats.hpp"

namespace fedwan::linkemu {
namespace {

uint16_t be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
uint32_t be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3];
}

constexpr uint8_t kTcp = 6;

}  // namespace

bool PacketInfo::parse(const uint8_t* p, size_t n, PacketInfo* out) {
  if (n < 20 || (p[0] >> 4) != 4) return false;
  const size_t ihl = size_t{p[0] & 0x0Fu} * 4;
  const size_t total = be16(p + 2);
  if (ihl < 20 || total < ihl || total > n) return false;
  PacketInfo info;
  info.protocol = p[9];
  info.src = be32(p + 12);
  info.dst = be32(p + 16);
  const bool first_fragment = (be16(p + 6) & 0x1FFF) == 0;
  if (info.protocol == kTcp && first_fragment && total >= ihl + 20) {
    const uint8_t* t = p + ihl;
    const size_t doff = static_cast<size_t>(t[12] >> 4) * 4;
    if (doff >= 20 && ihl + doff <= total) {
      info.tcp = true;
      info.sport = be16(t);
      info.dport = be16(t + 2);
      info.seq = be32(t + 4);
      info.payload = static_cast<uint32_t>(total - ihl - doff);
      info.syn = (t[13] & 0x02) != 0;
      info.fin = (t[13] & 0x01) != 0;
    }
  }
  *out = info;
  return true;
}

void PacketStats::offered(const PacketInfo& info, uint32_t bytes) {
  ++c_.packets;
  c_.bytes += bytes;
  if (!info.tcp) return;
  const uint64_t key = uint64_t{info.src} << 32 | uint64_t{info.sport} << 16 | info.dport;
  Flow& f = flows_[key];
  if (info.syn || !f.started) {
    // A SYN carries no payload and takes one sequence number.
    f.next = info.seq + (info.syn ? 1 : 0);
    f.started = true;
  }
  if (info.payload == 0) return;
  c_.tcp_payload += info.payload;
  const uint32_t end = info.seq + info.payload;
  // Serial-number arithmetic (RFC 1982): right for connections that wrap.
  const auto ahead = [](uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) > 0; };
  if (!ahead(end, f.next)) {
    c_.tcp_retransmitted += info.payload;
  } else if (ahead(f.next, info.seq)) {
    c_.tcp_retransmitted += f.next - info.seq;  // partly sent before
  }
  if (ahead(end, f.next)) f.next = end;
}

}  // namespace fedwan::linkemu
