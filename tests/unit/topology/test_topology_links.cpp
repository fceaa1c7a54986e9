// The topology's link settings beyond the tree: socket_buffer_bytes, the
// federation's and a node's (read, ranges, digest, YAML round trip).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "topology_test_util.hpp"

namespace fedwan {
namespace {

TEST(Topology, SocketBufferBytesFromTheFederationAndANode) {
  const Topology plain = Topology::parse(kExample);
  EXPECT_EQ(plain.federation().socket_buffer_bytes, 0u);  // the kernel's autotuning
  for (const NodeSpec& n : plain.nodes()) EXPECT_FALSE(n.socket_buffer_bytes) << n.id;

  const Topology t = Topology::parse(
      example_with(1, R"({id: eu, role: region, parent: root, endpoint: "tcp://127.0.0.1:7001", )"
                      R"(socket_buffer_bytes: 0})") +
      "federation: {socket_buffer_bytes: 8388608}\n");
  EXPECT_EQ(t.federation().socket_buffer_bytes, 8u << 20);
  EXPECT_EQ(t.node("eu").socket_buffer_bytes, 0u);  // autotuning on this node's links
  EXPECT_FALSE(t.node("site-a").socket_buffer_bytes);
}

TEST(Topology, RefusesASocketBufferOutOfRange) {
  for (const char* bad : {"1", "65535", "1073741825"}) {
    expect_error(example_with(-1, std::string("federation: {socket_buffer_bytes: ") + bad + "}\n"),
                 {"federation: socket_buffer_bytes " + std::string(bad) + " is out of range",
                  "0 (the kernel's autotuning)", "65536 .. 1073741824"});
  }
  expect_error(example_with(2, "{id: site-a, role: site, parent: eu, socket_buffer_bytes: 100}"),
               {"node 'site-a': socket_buffer_bytes 100 is out of range"});
  expect_error(example_with(-1, "federation: {socket_buffer_bytes: -1}\n"),
               {"socket_buffer_bytes"});
  EXPECT_EQ(error_of(example_with(-1, "federation: {socket_buffer_bytes: 65536}\n")), "");
  EXPECT_EQ(error_of(example_with(-1, "federation: {socket_buffer_bytes: 1073741824}\n")), "");
}

TEST(Topology, SocketBufferBytesInTheDigestOnlyWhenSet) {
  const Topology absent = Topology::parse(example_with(-1, ""));
  EXPECT_EQ(Topology::parse(example_with(-1, "federation: {socket_buffer_bytes: 0}\n")).digest(),
            absent.digest());
  std::set<std::string> digests = {absent.digest_hex()};
  for (const std::string& text :
       {example_with(-1, "federation: {socket_buffer_bytes: 4194304}\n"),
        example_with(2, "{id: site-a, role: site, parent: eu, weight: 6000, "
                        "socket_buffer_bytes: 0}"),
        example_with(2, "{id: site-a, role: site, parent: eu, weight: 6000, "
                        "socket_buffer_bytes: 1048576}")}) {
    const Topology t = Topology::parse(text);
    EXPECT_TRUE(digests.insert(t.digest_hex()).second) << text;
    const Topology back = Topology::parse(t.to_yaml());
    EXPECT_EQ(back.digest(), t.digest()) << t.to_yaml();
    EXPECT_EQ(back.federation().socket_buffer_bytes, t.federation().socket_buffer_bytes);
    for (const NodeSpec& n : t.nodes()) {
      EXPECT_EQ(back.node(n.id).socket_buffer_bytes, n.socket_buffer_bytes) << n.id;
    }
  }
}

}  // namespace
}  // namespace fedwan
