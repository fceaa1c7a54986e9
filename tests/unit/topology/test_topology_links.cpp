// The topology's link settings beyond the tree: socket_buffer_bytes and
// streams, the federation's and a node's (read, ranges, digest, YAML round
// trip).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

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

TEST(Topology, StreamsFromTheFederationAndANode) {
  const Topology plain = Topology::parse(kExample);
  EXPECT_EQ(plain.federation().streams, kStreamsAuto);  // as many as pay
  EXPECT_EQ(plain.federation().max_streams, 32u);
  for (const NodeSpec& n : plain.nodes()) EXPECT_FALSE(n.streams) << n.id;
  EXPECT_EQ(plain.uplink_streams(plain.node("site-a")).connections, 32u);
  EXPECT_TRUE(plain.uplink_streams(plain.node("site-a")).adaptive);
  EXPECT_EQ(plain.uplink_streams(plain.root()).connections, 1u);
  EXPECT_FALSE(plain.uplink_streams(plain.root()).adaptive);

  const Topology t = Topology::parse(
      example_with(1, R"({id: eu, role: region, parent: root, endpoint: "tcp://127.0.0.1:7001", )"
                      R"(streams: 2})") +
      "federation: {streams: 4}\n");
  EXPECT_EQ(t.federation().streams, 4u);
  EXPECT_EQ(t.node("eu").streams, 2u);  // eu's uplink to the root
  EXPECT_FALSE(t.node("site-a").streams);
  EXPECT_FALSE(t.root().streams);
  EXPECT_EQ(t.uplink_streams(t.node("eu")).connections, 2u);
  EXPECT_FALSE(t.uplink_streams(t.node("eu")).adaptive);
  EXPECT_EQ(t.uplink_streams(t.node("site-a")).connections, 4u);

  // auto with a cap, the federation's and a node's own.
  const Topology capped = Topology::parse(
      example_with(2, "{id: site-a, role: site, parent: eu, weight: 6000, streams: auto, "
                      "max_streams: 3}") +
      "federation: {streams: 2, max_streams: 12}\n");
  EXPECT_EQ(capped.uplink_streams(capped.node("site-a")).connections, 3u);
  EXPECT_TRUE(capped.uplink_streams(capped.node("site-a")).adaptive);
  EXPECT_EQ(capped.uplink_streams(capped.node("eu")).connections, 2u);
  EXPECT_FALSE(capped.uplink_streams(capped.node("eu")).adaptive);
  const Topology fed_auto = Topology::parse(example_with(-1, "federation: {max_streams: 12}\n"));
  EXPECT_EQ(fed_auto.uplink_streams(fed_auto.node("eu")).connections, 12u);

  const Topology site = Topology::parse(
      example_with(2, "{id: site-a, role: site, parent: eu, weight: 6000, streams: 16}"));
  EXPECT_EQ(site.federation().streams, kStreamsAuto);
  EXPECT_EQ(site.node("site-a").streams, 16u);
}

TEST(Topology, RefusesStreamsOutOfRange) {
  for (const char* bad : {"0", "17", "1000"}) {
    expect_error(example_with(-1, std::string("federation: {streams: ") + bad + "}\n"),
                 {"federation: streams " + std::string(bad) + " is out of range",
                  "a child opens 1 to 16 TCP connections to its parent"});
    expect_error(
        example_with(2, std::string("{id: site-a, role: site, parent: eu, streams: ") + bad + "}"),
        {"node 'site-a': streams " + std::string(bad) + " is out of range",
         "1 to 16 TCP connections"});
  }
  expect_error(example_with(-1, "federation: {streams: -1}\n"), {"streams"});
  for (const char* bad : {"0", "65"}) {
    expect_error(example_with(-1, std::string("federation: {max_streams: ") + bad + "}\n"),
                 {"max_streams " + std::string(bad) + " is out of range"});
  }
  expect_error(example_with(0, R"({id: root, role: root, endpoint: "tcp://127.0.0.1:7000", )"
                               R"(max_streams: 4})"),
               {"node 'root': max_streams 4 is set on the root"});
  expect_error(example_with(-1, "federation: {streams: two}\n"), {"streams"});
  for (const char* good : {"1", "2", "16", "auto"}) {
    EXPECT_EQ(error_of(example_with(-1, std::string("federation: {streams: ") + good + "}\n")), "")
        << good;
  }
}

TEST(Topology, RefusesStreamsOnTheRoot) {
  for (const char* n : {"1", "4"}) {
    expect_error(example_with(0, std::string(R"({id: root, role: root, )") +
                                     R"(endpoint: "tcp://127.0.0.1:7000", streams: )" + n + "}"),
                 {"node 'root': streams " + std::string(n) + " is set on the root",
                  "the root has no parent link to stripe"});
  }
  // Built in code rather than parsed: refused the same way.
  const Topology t = Topology::parse(kExample);
  std::vector<NodeSpec> nodes = t.nodes();
  nodes[t.root().index].streams = 2;
  try {
    Topology::build(t.job(), t.federation(), nodes);
    ADD_FAILURE() << "a root with streams was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("<build>: node 'root': streams 2 is set on the root"),
              std::string::npos)
        << e.what();
  }
}

TEST(Topology, StreamsInTheDigestOnlyWhenSet) {
  const Topology absent = Topology::parse(example_with(-1, ""));
  // The default stated explicitly is the default: the same digest.
  EXPECT_EQ(
      Topology::parse(example_with(-1, "federation: {streams: auto, max_streams: 32}\n")).digest(),
      absent.digest());
  EXPECT_EQ(Topology::parse(example_with(-1, "federation: {streams: auto}\n")).to_yaml(),
            absent.to_yaml());
  std::set<std::string> digests = {absent.digest_hex()};
  for (const std::string& text :
       {example_with(-1, "federation: {streams: 4}\n"),
        example_with(-1, "federation: {streams: 1}\n"),
        example_with(-1, "federation: {max_streams: 4}\n"),
        example_with(2, "{id: site-a, role: site, parent: eu, weight: 6000, max_streams: 2}"),
        example_with(2, "{id: site-a, role: site, parent: eu, weight: 6000, streams: auto}"),
        example_with(2, "{id: site-a, role: site, parent: eu, weight: 6000, streams: 1}"),
        example_with(2, "{id: site-a, role: site, parent: eu, weight: 6000, streams: 4}"),
        example_with(1, R"({id: eu, role: region, parent: root, endpoint: "tcp://127.0.0.1:7001", )"
                        R"(streams: 4})")}) {
    const Topology t = Topology::parse(text);
    EXPECT_TRUE(digests.insert(t.digest_hex()).second) << text;
    const Topology back = Topology::parse(t.to_yaml());
    EXPECT_EQ(back.digest(), t.digest()) << t.to_yaml();
    EXPECT_EQ(back.federation().streams, t.federation().streams);
    EXPECT_EQ(back.federation().max_streams, t.federation().max_streams);
    for (const NodeSpec& n : t.nodes()) {
      EXPECT_EQ(back.node(n.id).streams, n.streams) << n.id;
      EXPECT_EQ(back.node(n.id).max_streams, n.max_streams) << n.id;
    }
  }
}

}  // namespace
}  // namespace fedwan
