// Fragments (transport/fragments.hpp): a sealed frame cut into pieces and
// put back together in whatever order the pieces come; pieces that do not
// fit, come twice or name an impossible frame are refused with the reason;
// what is held is bounded and given up after a while.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "transport/fragments.hpp"

namespace fedwan::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::vector<uint8_t> bytes_of(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 9));
  return v;
}

std::vector<std::vector<uint8_t>> pieces_of(const std::vector<uint8_t>& frame, uint64_t id,
                                            size_t piece = kFragmentBytes) {
  Fragmenter f(frame, id, piece);
  std::vector<std::vector<uint8_t>> out;
  while (!f.done()) {
    EXPECT_EQ(f.next_size(), f.next().size());
    out.push_back(f.next());
    f.advance();
  }
  return out;
}

Reassembler::Options small() {
  Reassembler::Options o;
  o.max_frames = 3;
  o.max_bytes = 600'000;
  o.max_frame_bytes = 512 << 10;
  o.max_wait = 1000ms;
  return o;
}

TEST(Fragments, PiecesInAnyOrderMakeTheFrameAgain) {
  const std::vector<uint8_t> a = bytes_of(200'001, 1), b = bytes_of(70'000, 2);
  auto pa = pieces_of(a, 7), pb = pieces_of(b, 8);
  ASSERT_EQ(pa.size(), 7u) << "six of 32 KiB and the rest";
  EXPECT_EQ(pa.back().size(), kFragmentHeaderBytes + 200'001 - 6 * kFragmentBytes);
  // Two frames' pieces interleaved and shuffled, as over several connections.
  std::vector<std::vector<uint8_t>> all = pa;
  all.insert(all.end(), pb.begin(), pb.end());
  std::shuffle(all.begin(), all.end(), std::mt19937(3));
  Reassembler r({});
  std::vector<std::vector<uint8_t>> frames;
  const auto now = Clock::now();
  for (const auto& p : all) {
    ASSERT_TRUE(is_fragment(p.data(), p.size()));
    std::vector<uint8_t> whole;
    std::string why;
    const auto res = r.add(p.data(), p.size(), now, &whole, &why);
    ASSERT_NE(res, Reassembler::Result::kRefused) << why;
    if (res == Reassembler::Result::kFrame) frames.push_back(std::move(whole));
  }
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_TRUE((frames[0] == a && frames[1] == b) || (frames[0] == b && frames[1] == a));
  EXPECT_EQ(r.holding(), 0u);
  EXPECT_EQ(r.bytes(), 0u);
  EXPECT_EQ(r.stats().frames, 2u);
  EXPECT_EQ(r.stats().pieces, all.size());
}

TEST(Fragments, PiecesThatDoNotFitAreRefusedWithTheReason) {
  const std::vector<uint8_t> frame = bytes_of(100'000, 4);
  const auto pieces = pieces_of(frame, 9);
  const auto now = Clock::now();
  const auto refused = [&](std::vector<uint8_t> p, Reassembler& r) {
    std::vector<uint8_t> whole;
    std::string why;
    EXPECT_EQ(r.add(p.data(), p.size(), now, &whole, &why), Reassembler::Result::kRefused);
    return why;
  };
  const auto set_u32 = [](std::vector<uint8_t>& p, size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[at + i] = static_cast<uint8_t>(v >> (8 * i));
  };
  Reassembler r(small());
  std::vector<uint8_t> p = pieces[0];
  p[4] = 2;
  EXPECT_NE(refused(p, r).find("unknown version 2"), std::string::npos);
  p = pieces[0];
  set_u32(p, 16, 600 << 10);  // beyond max_frame_bytes
  EXPECT_NE(refused(p, r).find("out of bounds"), std::string::npos);
  p = pieces[0];
  set_u32(p, 20, 1024);  // pieces too small to bound the count
  EXPECT_NE(refused(p, r).find("does not fit"), std::string::npos);
  p = pieces[1];
  set_u32(p, 24, 1000);  // not on a piece boundary
  EXPECT_NE(refused(p, r).find("does not fit"), std::string::npos);
  p = pieces[0];
  p.pop_back();  // shorter than its place says
  EXPECT_NE(refused(p, r).find("does not fit"), std::string::npos);
  p = pieces[0];
  p.resize(10);
  EXPECT_NE(refused(p, r).find("too short"), std::string::npos);
  // A piece twice, and a piece that names the same frame with another size.
  std::vector<uint8_t> whole;
  std::string why;
  ASSERT_EQ(r.add(pieces[0].data(), pieces[0].size(), now, &whole, &why),
            Reassembler::Result::kPending);
  EXPECT_NE(refused(pieces[0], r).find("came twice"), std::string::npos);
  const auto other = pieces_of(bytes_of(80'000, 5), 9);
  EXPECT_NE(refused(other[1], r).find("another size"), std::string::npos);
  EXPECT_EQ(r.stats().refused, 8u);
  // The frame still completes from its own pieces.
  for (size_t i = 1; i < pieces.size(); ++i) {
    (void)r.add(pieces[i].data(), pieces[i].size(), now, &whole, &why);
  }
  EXPECT_EQ(whole, frame);
}

TEST(Fragments, WhatIsHeldIsBoundedAndGivenUpAfterAWhile) {
  Reassembler r(small());
  const auto now = Clock::now();
  std::vector<uint8_t> whole;
  std::string why;
  // Four frames started, room for three: the oldest goes.
  for (uint64_t id = 1; id <= 4; ++id) {
    const auto p = pieces_of(bytes_of(100'000, static_cast<uint8_t>(id)), id);
    ASSERT_EQ(r.add(p[0].data(), p[0].size(), now + std::chrono::milliseconds(id), &whole, &why),
              Reassembler::Result::kPending);
  }
  EXPECT_EQ(r.holding(), 3u);
  EXPECT_EQ(r.stats().dropped, 1u);
  EXPECT_EQ(r.bytes(), 300'000u);
  // By bytes: a frame of 500 KB (600 KB held at most) leaves room for one
  // of 100 KB beside it.
  const auto big = pieces_of(bytes_of(500'000, 9), 10);
  ASSERT_EQ(r.add(big[0].data(), big[0].size(), now + 10ms, &whole, &why),
            Reassembler::Result::kPending);
  EXPECT_EQ(r.bytes(), 600'000u);
  EXPECT_EQ(r.holding(), 2u);
  EXPECT_EQ(r.stats().dropped, 3u);
  // Past the wait, what is held is given up.
  const auto late = pieces_of(bytes_of(100'000, 11), 11);
  ASSERT_EQ(r.add(late[0].data(), late[0].size(), now + 2000ms, &whole, &why),
            Reassembler::Result::kPending);
  EXPECT_EQ(r.holding(), 1u);
  EXPECT_EQ(r.bytes(), 100'000u);
  EXPECT_EQ(r.stats().dropped, 5u);
}

TEST(Fragments, AFrameMessageIsNoFragment) {
  const uint8_t frame[8] = {'F', 'W', 'A', 'N', 1, 2, 0, 0x80};
  EXPECT_FALSE(is_fragment(frame, sizeof frame));
  EXPECT_FALSE(is_fragment(frame, 3));
}

}  // namespace
}  // namespace fedwan::transport
