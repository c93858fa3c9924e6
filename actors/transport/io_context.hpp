#pragma once
// The process's ZeroMQ context as the roles are handed it: one per process, so
// that their transports can talk over inproc://. Kept apart from transport.hpp,
// whose codec and sockets the actor headers need not see.

#include <memory>

namespace zmq {
class context_t;
}

namespace archipelago::transport {

using io_context = std::shared_ptr<zmq::context_t>;

}  // namespace archipelago::transport
