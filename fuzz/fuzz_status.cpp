// Fuzzes the reader of a node's /status answer (`fedwan status`), which is
// untrusted input from the network: any node, or anything listening at its
// metrics address, may answer anything.
//
// read_node_status promises never to throw: a well-formed answer becomes a
// NodeStatus (every field of the expected type or unknown), anything else a
// short reason. Beyond that this checks what the tree relies on: an answer
// is either read or has a reason, never both, and the same answer always
// reads the same. Seeds: an aggregator's answer with children and the
// privacy object, and a site's.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/node_status.hpp"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_status: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (const char* node : {"root", "region-0", "site-1"}) {
    fedwan::cli::StatusReading r;
    try {
      r = fedwan::cli::read_node_status(body, node);
    } catch (...) {
      fail("read_node_status threw");
    }
    if (r.status.has_value() == !r.malformed.empty()) {
      fail("an answer is either read or malformed, with a reason");
    }
    // The same answer read again reads the same (no hidden state).
    const fedwan::cli::StatusReading again = fedwan::cli::read_node_status(body, node);
    if (again.malformed != r.malformed || again.status.has_value() != r.status.has_value()) {
      fail("reading the same answer twice differs");
    }
  }
  return 0;
}
