#include "packet_stats.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace fedwan::linkemu {
namespace {

// An IPv4 packet carrying a TCP segment of `payload` bytes (20-byte IP
// header, TCP header of `tcp_header` bytes).
std::vector<uint8_t> tcp_packet(uint32_t seq, uint32_t payload, bool syn = false,
                                size_t tcp_header = 32) {
  const size_t total = 20 + tcp_header + payload;
  std::vector<uint8_t> p(total, 0);
  p[0] = 0x45;
  p[2] = static_cast<uint8_t>(total >> 8);
  p[3] = static_cast<uint8_t>(total);
  p[9] = 6;
  const uint8_t src[4] = {10, 77, 0, 1}, dst[4] = {10, 77, 0, 2};
  std::copy(src, src + 4, p.begin() + 12);
  std::copy(dst, dst + 4, p.begin() + 16);
  uint8_t* t = p.data() + 20;
  t[0] = 0x9C;  // source port 40000
  t[1] = 0x40;
  t[2] = 0x1B;  // destination port 7000
  t[3] = 0x58;
  t[4] = static_cast<uint8_t>(seq >> 24);
  t[5] = static_cast<uint8_t>(seq >> 16);
  t[6] = static_cast<uint8_t>(seq >> 8);
  t[7] = static_cast<uint8_t>(seq);
  t[12] = static_cast<uint8_t>((tcp_header / 4) << 4);
  t[13] = syn ? 0x02 : 0x10;
  return p;
}

PacketInfo parsed(const std::vector<uint8_t>& p) {
  PacketInfo info;
  EXPECT_TRUE(PacketInfo::parse(p.data(), p.size(), &info));
  return info;
}

TEST(PacketInfo, ReadsAddressesPortsSequenceAndPayload) {
  const PacketInfo info = parsed(tcp_packet(123456789, 1448));
  EXPECT_EQ(info.src, 0x0A4D0001u);
  EXPECT_EQ(info.dst, 0x0A4D0002u);
  EXPECT_TRUE(info.tcp);
  EXPECT_EQ(info.sport, 40000);
  EXPECT_EQ(info.dport, 7000);
  EXPECT_EQ(info.seq, 123456789u);
  EXPECT_EQ(info.payload, 1448u);
  EXPECT_FALSE(info.syn);
}

TEST(PacketInfo, RefusesWhatIsNotAWholeIpv4Packet) {
  std::vector<uint8_t> p = tcp_packet(1, 100);
  PacketInfo info;
  EXPECT_FALSE(PacketInfo::parse(p.data(), 19, &info));            // shorter than a header
  EXPECT_FALSE(PacketInfo::parse(p.data(), p.size() - 1, &info));  // total length says more
  p[0] = 0x65;                                                     // IPv6 version nibble
  EXPECT_FALSE(PacketInfo::parse(p.data(), p.size(), &info));
  p[0] = 0x44;  // header length 16 < 20
  EXPECT_FALSE(PacketInfo::parse(p.data(), p.size(), &info));
  // A TCP data offset past the packet: an IP packet, but no TCP payload read.
  p = tcp_packet(1, 0, false, 20);
  p[20 + 12] = 0xF0;
  ASSERT_TRUE(PacketInfo::parse(p.data(), p.size(), &info));
  EXPECT_FALSE(info.tcp);
}

TEST(PacketStats, CountsRetransmittedPayloadApartFromNewPayload) {
  PacketStats s;
  s.offered(parsed(tcp_packet(1000, 0, /*syn=*/true)), 52);
  s.offered(parsed(tcp_packet(1001, 1000)), 1052);
  s.offered(parsed(tcp_packet(2001, 1000)), 1052);
  s.offered(parsed(tcp_packet(1001, 1000)), 1052);  // the first segment again
  s.offered(parsed(tcp_packet(2501, 1000)), 1052);  // half of it sent before
  s.offered(parsed(tcp_packet(3501, 0)), 52);       // a pure ACK
  const DirectionCounters& c = s.counters();
  EXPECT_EQ(c.packets, 6u);
  EXPECT_EQ(c.bytes, 52u * 2 + 1052u * 4);
  EXPECT_EQ(c.tcp_payload, 4000u);
  EXPECT_EQ(c.tcp_retransmitted, 1500u);
  EXPECT_EQ(c.tcp_payload - c.tcp_retransmitted, 2500u);  // bytes 1001..3500
}

TEST(PacketStats, SequenceNumbersThatWrapAreStillNew) {
  PacketStats s;
  s.offered(parsed(tcp_packet(0xFFFFFF00u, 0, /*syn=*/true)), 52);
  s.offered(parsed(tcp_packet(0xFFFFFF01u, 1000)), 1052);  // wraps past 2^32
  s.offered(parsed(tcp_packet(0x000002E9u, 1000)), 1052);
  EXPECT_EQ(s.counters().tcp_payload, 2000u);
  EXPECT_EQ(s.counters().tcp_retransmitted, 0u);
  s.offered(parsed(tcp_packet(0xFFFFFF01u, 1000)), 1052);
  EXPECT_EQ(s.counters().tcp_retransmitted, 1000u);
}

}  // namespace
}  // namespace fedwan::linkemu
