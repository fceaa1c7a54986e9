// Shared by the topology tests: the example topology and helpers that build
// variants of it and check how parsing refuses them.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"
#include "harness/error_message.hpp"

namespace fedwan {

inline const char* const kExample = R"(
job: fashion-demo
federation:            # optional; every key optional
  rounds: 20
  inner_steps: 50
  codec: fp16
  chunk_bytes: 1048576
  round_timeout_s: 600
  outer_optimizer: {name: diloco, lr: 0.7, momentum: 0.9}
nodes:
  - {id: root, role: root, endpoint: "tcp://127.0.0.1:7000"}
  - {id: eu, role: region, parent: root, endpoint: "tcp://127.0.0.1:7001", bind: "tcp://*:7001"}
  - {id: site-a, role: site, parent: eu, weight: 6000}
  - {id: us, role: region, parent: root, endpoint: "tcp://127.0.0.1:7002"}
  - {id: site-b, role: site, parent: eu, weight: 4000}
  - {id: site-c, role: site, parent: us}
)";

// The example with one node line replaced (`line` is the index in `nodes`),
// or with extra text appended to the node list when line < 0.
inline std::string example_with(int line, const std::string& replacement) {
  std::vector<std::string> nodes = {
      R"({id: root, role: root, endpoint: "tcp://127.0.0.1:7000"})",
      R"({id: eu, role: region, parent: root, endpoint: "tcp://127.0.0.1:7001"})",
      R"({id: site-a, role: site, parent: eu, weight: 6000})",
      R"({id: us, role: region, parent: root, endpoint: "tcp://127.0.0.1:7002"})",
      R"({id: site-b, role: site, parent: eu, weight: 4000})",
      R"({id: site-c, role: site, parent: us})"};
  if (line >= 0) nodes[static_cast<size_t>(line)] = replacement;
  std::string y = "job: fashion-demo\nnodes:\n";
  for (const std::string& n : nodes) {
    if (!n.empty()) y += "  - " + n + "\n";
  }
  if (line < 0) y += replacement;
  return y;
}

// Parses and returns the ConfigError message ("" if it parsed).
inline std::string error_of(const std::string& yaml) {
  return testing::config_error([&] { Topology::parse(yaml, "topo.yaml"); });
}

inline void expect_error(const std::string& yaml, const std::vector<std::string>& parts) {
  std::string msg = error_of(yaml);
  ASSERT_FALSE(msg.empty()) << "accepted:\n" << yaml;
  EXPECT_EQ(msg.rfind("topo.yaml", 0), 0u) << msg;
  for (const std::string& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

}  // namespace fedwan
