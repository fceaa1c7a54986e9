// A loopback TCP port for a process that will listen on it soon (the demo's
// nodes, the tests' federations), chosen so that nothing else takes it in
// between: outside the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), where no client socket of any process is
// given its local port, so neither a connection made meanwhile nor one made
// while a killed node restarts can hold it; free to bind when chosen; and
// reserved by a lock (flock on a file under the temporary directory, one
// per port, per user) that this process holds until it exits, so that
// processes choosing at the same time never choose the same port.
//
// Thread safe. Throws fedwan::Error when no port can be found.
#pragma once

#include <utility>

namespace fedwan {

int reserve_loopback_port();

// The ports reserve_loopback_port() chooses from, given the ephemeral range
// [lo, hi]: below it when there is room, else above it (pure; unit-tested).
std::pair<int, int> ports_outside_ephemeral(int lo, int hi);

}  // namespace fedwan
