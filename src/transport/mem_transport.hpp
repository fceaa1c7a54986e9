// The in-process transport (mem://NAME): nodes that run as threads of one
// process exchange messages through queues, with no socket, no kernel and
// no ZeroMQ, under the semantics transport.hpp states (windows, connect
// before bind, routing-id handover, per-peer order). The thread-federation
// tests run whole federations over it, which proves that the aggregator and
// the site use nothing of a transport but its interface.
//
// Endpoints live in one process-wide table: a server bound at mem://x is
// reached by clients of any mem transport object. Closing a server loses
// what its clients had sent and it had not read (as a dropped connection
// would); the clients stay connected and reach the next server bound there.
#pragma once

#include <memory>

#include "transport/transport.hpp"

namespace fedwan::transport {

std::unique_ptr<Transport> make_mem_transport();

}  // namespace fedwan::transport
