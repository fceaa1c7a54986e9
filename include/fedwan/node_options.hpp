// What every node of the federation is given, whatever its role: the base
// of AggregatorOptions (fedwan/aggregator.hpp: a root or region) and
// SiteOptions (fedwan/site_core.hpp: a site), which add their role's own
// fields (the round timeout among them) and are what callers fill in.
#pragma once

#include "fedwan/export.hpp"

#include <chrono>
#include <string>

#include "fedwan/security.hpp"
#include "fedwan/topology.hpp"

namespace fedwan {

struct FEDWAN_API NodeOptions {
  Topology topology;
  // This node in the topology: a root or region for an aggregator, a site
  // for a site.
  std::string node_id;
  // How long joining may take: a site's join() waits this long for its
  // parent's welcome, an aggregator for its children to join. A node that
  // keeps checkpoints (checkpoint_dir) but has no intact one of its own
  // first waits up to this long for the replica its parent (the root: its
  // standby) keeps of it.
  std::chrono::milliseconds join_timeout{std::chrono::minutes(5)};
  int window = 4;  // frames queued per peer and direction
  // Mutual TLS credentials (or explicit plaintext) and the audit log.
  SecurityOptions security;
  // Fault tolerance (docs/operations.md). With a directory, the node writes
  // a checkpoint there at every round boundary (a site also on
  // SiteCore::checkpoint()) and, when one is there at start (a site: in
  // join()), resumes from it instead of starting over: an aggregator at its
  // last committed round; a site with its parameters, anchor,
  // error-feedback residual, round, data position and the blobs of
  // SiteOptions::save_state. Empty: no checkpoints.
  std::string checkpoint_dir;
  // Cost accounting (docs/operations.md, "Cost accounting"): appends one
  // JSON line per round here with the bytes sent and received on each of
  // this node's links; a site's also has the seconds the caller trained
  // between syncs (times SiteOptions::devices: device-seconds of kind
  // SiteOptions::device_kind, "cpu" or "gpu") and whether it contributed.
  // Empty: no records.
  std::string costs_path;
  // Where to serve Prometheus metrics and the JSON status over HTTP
  // ("host:port"); empty: the topology's `metrics` for this node, if any.
  std::string metrics_bind;
  // A file holding the bearer token every request to that endpoint must
  // carry (`Authorization: Bearer <token>`); read at start. ConfigError when
  // others than its owner and group may read it, or the token is empty or
  // shorter than 16 characters. Empty: the endpoint needs no token.
  std::string metrics_token_file;
};

}  // namespace fedwan
