#include "transport/message_port.hpp"

namespace archipelago::transport {

void refuse_fenced(message_port& port, const decoded_envelope& env, std::uint64_t known_epoch) {
  port.raise_broker_epoch(known_epoch);
  if (env.body() == wire::Envelope::Body::ERROR) return;  // never an answer to an answer
  auto b = port.make_envelope();
  auto e = b.body().initError();
  e.setCode(wire::ErrorCode::FENCED);
  e.setMessage("broker epoch " + std::to_string(env.header().getBrokerEpoch()) + " is older than " +
               std::to_string(known_epoch) + ": another broker leads");
  e.setInReplyTo(env.header().getSequence());
  (void)port.send(env.sender(), b.finish());
}

}  // namespace archipelago::transport
