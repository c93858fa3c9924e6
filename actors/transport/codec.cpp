#include "transport/codec.hpp"

#include <cstring>

#include "core/checksum.hpp"

namespace archipelago::transport {
namespace {

constexpr std::uint16_t max_known_body = static_cast<std::uint16_t>(wire::Envelope::Body::RECONFIGURE);
constexpr std::uint16_t max_known_encoding = static_cast<std::uint16_t>(wire::TensorEncoding::INT2);
constexpr std::uint16_t max_known_role = static_cast<std::uint16_t>(wire::Role::ADMIN);

/// Reads every text field of the active body, so a text without its NUL
/// terminator (or out of bounds) fails here and not in a later reader.
void touch_texts(wire::Envelope::Reader root) {
  for (auto t : root.getTensors()) t.getName();
  auto body = root.getBody();
  switch (body.which()) {
    case wire::Envelope::Body::JOIN:
      body.getJoin().getEndpoint();
      body.getJoin().getLayout();
      break;
    case wire::Envelope::Body::WELCOME:
      for (auto s : body.getWelcome().getShards()) {
        s.getEndpoint();
        s.getFragments();
      }
      for (auto s : body.getWelcome().getSettings()) s.getKey(), s.getValue();
      break;
    case wire::Envelope::Body::RECONFIGURE:
      for (auto s : body.getReconfigure().getSettings()) s.getKey(), s.getValue();
      body.getReconfigure().getReplyEndpoint();
      break;
    case wire::Envelope::Body::LEAVE: body.getLeave().getReason(); break;
    case wire::Envelope::Body::ROUND_CLOSE: body.getRoundClose().getMembers(); break;
    case wire::Envelope::Body::ERROR: body.getError().getMessage(); break;
    default: break;
  }
}

}  // namespace

const char* to_string(reject_reason reason) {
  switch (reason) {
    case reject_reason::no_frames: return "no_frames";
    case reject_reason::bad_envelope_size: return "bad_envelope_size";
    case reject_reason::envelope_checksum: return "envelope_checksum";
    case reject_reason::malformed: return "malformed";
    case reject_reason::version_mismatch: return "version_mismatch";
    case reject_reason::unknown_body: return "unknown_body";
    case reject_reason::bad_sender: return "bad_sender";
    case reject_reason::tensor_count: return "tensor_count";
    case reject_reason::tensor_length: return "tensor_length";
    case reject_reason::tensor_encoding: return "tensor_encoding";
    case reject_reason::tensor_checksum: return "tensor_checksum";
    case reject_reason::impersonation: return "impersonation";
    case reject_reason::not_permitted: return "not_permitted";
    case reject_reason::count_: break;
  }
  return "unknown";
}

node_address decoded_envelope::sender() const {
  auto s = root_.getHeader().getSender();
  return {static_cast<role>(static_cast<std::uint16_t>(s.getRole())), s.getIndex()};
}

status decoded_envelope::decode_tensor_values(std::size_t i, float* out) const {
  const auto info = tensor_info(i);
  const frame_view bytes = tensors_.at(i);
  const auto encoding = static_cast<tensor_encoding>(static_cast<std::uint16_t>(info.getEncoding()));
  // Unquantised encodings have no blocks; their descriptor's block size is not checked.
  const bool quantised = encoding != tensor_encoding::fp32 && encoding != tensor_encoding::bf16;
  return decode_tensor(bytes.data, bytes.size, info.getElementCount(), encoding,
                       quantised ? static_cast<int>(info.getBlockSize()) : default_block_size, out);
}

decode_result decode_envelope(const std::vector<frame_view>& frames, const decode_limits& limits) {
  decode_result result;
  auto fail = [&](reject_reason reason, std::string message) {
    result.envelope_.reset();
    result.reason_ = reason;
    result.message_ = std::move(message);
    return std::move(result);
  };
  if (frames.empty()) return fail(reject_reason::no_frames, "message has no frames");
  const frame_view first = frames.front();
  if (first.size < 2 * sizeof(capnp::word) || first.size % sizeof(capnp::word) != 0 ||
      first.size > limits.max_envelope_bytes)
    return fail(reject_reason::bad_envelope_size,
                "envelope frame of " + std::to_string(first.size) +
                    " bytes (must be a multiple of 8, at least 16, at most " +
                    std::to_string(limits.max_envelope_bytes) + ")");
  // The last word is the checksum of the Cap'n Proto message before it.
  const std::size_t message_bytes = first.size - sizeof(capnp::word);
  std::uint64_t trailer = 0;
  std::memcpy(&trailer, first.data + message_bytes, sizeof trailer);
  if (checksum64(first.data, message_bytes) != trailer)
    return fail(reject_reason::envelope_checksum, "envelope checksum mismatch");

  auto env = std::make_unique<decoded_envelope>();
  const capnp::word* words = reinterpret_cast<const capnp::word*>(first.data);
  const std::size_t word_count = message_bytes / sizeof(capnp::word);
  // ZeroMQ delivers small frames at arbitrary offsets; Cap'n Proto needs 8-byte alignment.
  if (reinterpret_cast<std::uintptr_t>(first.data) % alignof(capnp::word) != 0) {
    env->aligned_copy_ = kj::heapArray<capnp::word>(word_count);
    std::memcpy(env->aligned_copy_.begin(), first.data, message_bytes);
    words = env->aligned_copy_.begin();
  }
  capnp::ReaderOptions options;
  // The reader's budget covers the whole life of the decoded message: enough
  // for consumers to read every field many times. Amplification (pointers that
  // alias one another) is refused below instead.
  options.traversalLimitInWords = 64 * word_count + 1024;
  options.nestingLimit = limits.nesting_limit;

  try {
    env->reader_ = std::make_unique<capnp::FlatArrayMessageReader>(
        kj::arrayPtr(words, word_count), options);
    env->root_ = env->reader_->getRoot<wire::Envelope>();
    // One full traversal; without aliasing it can never visit more words than
    // the message holds.
    if (env->root_.totalSize().wordCount > word_count)
      return fail(reject_reason::malformed, "envelope pointers alias one another (amplification)");
    auto header = env->root_.getHeader();
    if (header.getProtocolVersion() != wire::PROTOCOL_VERSION) {
      result.peer_version_ = header.getProtocolVersion();
      return fail(reject_reason::version_mismatch,
                  "protocol version " + std::to_string(header.getProtocolVersion()) +
                      " from peer, this node speaks " + std::to_string(wire::PROTOCOL_VERSION));
    }
    if (static_cast<std::uint16_t>(header.getSender().getRole()) > max_known_role)
      return fail(reject_reason::bad_sender, "unknown sender role " +
                                                 std::to_string(static_cast<std::uint16_t>(header.getSender().getRole())));
    const auto which = static_cast<std::uint16_t>(env->root_.getBody().which());
    if (which > max_known_body)
      return fail(reject_reason::unknown_body, "unknown body tag " + std::to_string(which));
    touch_texts(env->root_);

    auto tensors = env->root_.getTensors();
    if (tensors.size() != frames.size() - 1 || tensors.size() > limits.max_tensors)
      return fail(reject_reason::tensor_count,
                  std::to_string(tensors.size()) + " tensor descriptors for " +
                      std::to_string(frames.size() - 1) + " tensor frames (limit " +
                      std::to_string(limits.max_tensors) + ")");
    for (unsigned i = 0; i < tensors.size(); ++i) {
      auto info = tensors[i];
      const frame_view bytes = frames[i + 1];
      const std::string which_tensor = "tensor " + std::to_string(i) + " ('" + info.getName().cStr() + "')";
      if (info.getByteLength() != bytes.size || bytes.size > limits.max_tensor_bytes)
        return fail(reject_reason::tensor_length,
                    which_tensor + ": frame has " + std::to_string(bytes.size) + " bytes, header says " +
                        std::to_string(info.getByteLength()) + " (limit " +
                        std::to_string(limits.max_tensor_bytes) + ")");
      const auto encoding = static_cast<std::uint16_t>(info.getEncoding());
      if (encoding > max_known_encoding)
        return fail(reject_reason::tensor_encoding, which_tensor + ": unknown encoding " + std::to_string(encoding));
      const auto enc = static_cast<tensor_encoding>(encoding);
      const bool quantised = enc != tensor_encoding::fp32 && enc != tensor_encoding::bf16;
      const std::uint32_t block = info.getBlockSize();
      if (quantised && (block < min_block_size || block > max_block_size))
        return fail(reject_reason::tensor_encoding, which_tensor + ": block size " + std::to_string(block) +
                                                        " outside [" + std::to_string(min_block_size) + ", " +
                                                        std::to_string(max_block_size) + "]");
      // The element count comes from the peer: bound it by the frame before
      // computing sizes from it.
      const std::uint64_t count = info.getElementCount();
      if (count > bytes.size * 4 + 4 ||
          encoded_bytes(enc, count, quantised ? static_cast<int>(block) : default_block_size) != bytes.size)
        return fail(reject_reason::tensor_encoding,
                    which_tensor + ": " + std::to_string(count) + " " + to_string(enc) +
                        " values cannot be " + std::to_string(bytes.size) + " bytes");
      if (checksum64(bytes.data, bytes.size) != info.getChecksum())
        return fail(reject_reason::tensor_checksum, which_tensor + ": checksum mismatch");
      env->tensors_.push_back(bytes);
    }
  } catch (const kj::Exception& e) {
    return fail(reject_reason::malformed, std::string("malformed envelope: ") + e.getDescription().cStr());
  }
  result.envelope_ = std::move(env);
  return result;
}

std::size_t encoded_message::total_bytes() const {
  std::size_t total = envelope.size() * sizeof(capnp::word);
  for (const auto& t : tensors) total += t.size();
  return total;
}

wire::Role to_wire(role r) { return static_cast<wire::Role>(static_cast<std::uint16_t>(r)); }

wire::NodeAddress::Builder set_address(wire::NodeAddress::Builder b, node_address a) {
  b.setRole(to_wire(a.kind));
  b.setIndex(a.index);
  return b;
}

envelope_builder::envelope_builder(node_address sender, incarnation inc, std::uint64_t sequence,
                                   std::uint64_t round, std::uint64_t broker_epoch)
    : root_(builder_.initRoot<wire::Envelope>()) {
  auto header = root_.initHeader();
  header.setProtocolVersion(wire::PROTOCOL_VERSION);
  set_address(header.initSender(), sender);
  header.setIncarnation(inc.value);
  header.setSequence(sequence);
  header.setRound(round);
  header.setBrokerEpoch(broker_epoch);
}

shared_bytes::shared_bytes(std::vector<std::uint8_t> bytes) {
  auto owned = std::make_shared<const std::vector<std::uint8_t>>(std::move(bytes));
  data_ = owned->data();
  size_ = owned->size();
  owner_ = std::move(owned);
}

void envelope_builder::add_tensor(const std::string& name, tensor_encoding encoding,
                                  std::uint64_t element_count, std::uint32_t block_size,
                                  shared_bytes bytes) {
  tensors_.push_back({name, encoding, element_count, block_size, std::move(bytes)});
}

status envelope_builder::add_tensor_values(const std::string& name, const float* values,
                                           std::size_t count, tensor_encoding encoding,
                                           std::uint32_t block_size) {
  auto bytes = encode_tensor(values, count, encoding, static_cast<int>(block_size));
  if (!bytes) return status(bytes.err());
  add_tensor(name, encoding, count, block_size, shared_bytes(std::move(*bytes)));
  return {};
}

void envelope_builder::add_fp32(const std::string& name, std::shared_ptr<const std::vector<float>> values) {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(values->data());  // fp32 frames are little-endian floats
  const std::size_t count = values->size();
  add_tensor(name, tensor_encoding::fp32, count, default_block_size,
             shared_bytes(std::move(values), bytes, count * sizeof(float)));
}

encoded_message envelope_builder::finish() {
  auto list = root_.initTensors(static_cast<unsigned>(tensors_.size()));
  encoded_message out;
  for (unsigned i = 0; i < tensors_.size(); ++i) {
    const pending& t = tensors_[i];
    auto info = list[i];
    info.setName(t.name);
    info.setEncoding(static_cast<wire::TensorEncoding>(static_cast<std::uint16_t>(t.encoding)));
    info.setElementCount(t.count);
    info.setByteLength(t.bytes.size());
    info.setBlockSize(t.block_size);
    info.setChecksum(checksum64(t.bytes.data(), t.bytes.size()));
    out.tensors.push_back(t.bytes);
  }
  const kj::Array<capnp::word> flat = capnp::messageToFlatArray(builder_);
  out.envelope = kj::heapArray<capnp::word>(flat.size() + 1);
  std::memcpy(static_cast<void*>(out.envelope.begin()), flat.begin(), flat.size() * sizeof(capnp::word));
  const std::uint64_t sum = checksum64(flat.begin(), flat.size() * sizeof(capnp::word));
  std::memcpy(static_cast<void*>(out.envelope.begin() + flat.size()), &sum, sizeof sum);
  return out;
}

}  // namespace archipelago::transport
