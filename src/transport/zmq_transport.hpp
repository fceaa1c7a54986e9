// The ZeroMQ transport (tcp://, ipc://, inproc://): a client socket is a
// DEALER under a routing id that names its node, link and connection
// (routing_id.hpp), a server socket a ROUTER with ROUTER_MANDATORY (an
// unknown peer is an answer, not a silent drop) and ROUTER_HANDOVER (a
// connection that ZeroMQ re-establishes takes its id back). ZeroMQ
// reconnects a dropped TCP connection by itself. One context per transport;
// inproc:// reaches only sockets of the same transport object. A tcp://
// socket with SocketOptions::tcp_congestion sets it on each connection it
// opens (congestion_monitor.hpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/transport.hpp"

namespace fedwan::transport {

std::unique_ptr<Transport> make_zmq_transport();

}  // namespace fedwan::transport
