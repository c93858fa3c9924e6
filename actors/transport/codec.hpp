#pragma once
// Envelope codec: one Cap'n Proto Envelope frame (the flat message followed by
// one word, its XXH3-64 checksum) plus one raw frame per tensor
// (schemas/envelope.capnp, schemas/README.md). Encoding computes each tensor
// frame's length and checksum into the Envelope; decoding validates everything
// a peer could get wrong before anyone reads a field: frame shape and
// alignment, reader limits, protocol version, union tag, every text field,
// tensor count, lengths, encoded sizes and checksums. A rejected message is a
// value naming the reason (counted by the transport), never an exception.

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/ids.hpp"
#include "schemas/envelope.capnp.h"
#include "transport/tensor_encoding.hpp"

namespace archipelago::transport {

/// Borrowed bytes of one received frame; the owner keeps them alive while a
/// decoded_envelope refers to them.
struct frame_view {
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
};

/// Why a message was rejected; the transport keeps one counter per reason.
enum class reject_reason : std::uint8_t {
  no_frames,          // an empty multipart message
  bad_envelope_size,  // too short, not a multiple of 8 bytes, or above the limit
  envelope_checksum,  // the envelope frame's trailing checksum does not match
  malformed,          // Cap'n Proto validation failed (bounds, limits, text)
  version_mismatch,   // protocol versions differ
  unknown_body,       // union tag this build does not know
  bad_sender,         // role out of range
  tensor_count,       // tensor descriptors do not match the extra frames
  tensor_length,      // a frame's length differs from its descriptor
  tensor_encoding,    // unknown encoding, bad block size, or size that does not fit
  tensor_checksum,    // checksum mismatch: corrupted in flight
  impersonation,      // the header's sender is not the identity the connection's CURVE key is bound to
  not_permitted,      // the sender's role may not send this body (peer_identity.hpp)
  count_              // number of reasons
};
const char* to_string(reject_reason reason);

struct decode_limits {
  std::size_t max_envelope_bytes = std::size_t{1} << 20;  // the Envelope frame itself
  std::size_t max_tensor_bytes = std::size_t{1} << 30;    // one tensor frame
  std::size_t max_tensors = 64;                           // tensor frames per message
  int nesting_limit = 16;
};

class decode_result;
/// Validates a received multipart message (frames[0] = Envelope, then tensors).
decode_result decode_envelope(const std::vector<frame_view>& frames, const decode_limits& limits = {});

/// A validated message. Field access cannot fail any more.
class decoded_envelope {
 public:
  wire::Envelope::Reader root() const { return root_; }
  wire::Header::Reader header() const { return root_.getHeader(); }
  wire::Envelope::Body::Which body() const { return root_.getBody().which(); }
  node_address sender() const;
  std::size_t tensor_count() const { return tensors_.size(); }
  frame_view tensor_bytes(std::size_t i) const { return tensors_.at(i); }
  wire::TensorFrame::Reader tensor_info(std::size_t i) const { return root_.getTensors()[static_cast<unsigned>(i)]; }
  /// Decodes tensor i into `out` (element_count floats); non-finite values are
  /// corrupt_data.
  status decode_tensor_values(std::size_t i, float* out) const;

 private:
  friend decode_result decode_envelope(const std::vector<frame_view>&, const decode_limits&);
  kj::Array<capnp::word> aligned_copy_;  // used when the frame was not 8-byte aligned
  std::unique_ptr<capnp::FlatArrayMessageReader> reader_;
  wire::Envelope::Reader root_;
  std::vector<frame_view> tensors_;
};

class decode_result {
 public:
  bool ok() const { return envelope_ != nullptr; }
  explicit operator bool() const { return ok(); }
  decoded_envelope& value() { return *envelope_; }
  const decoded_envelope& value() const { return *envelope_; }
  std::unique_ptr<decoded_envelope> take() { return std::move(envelope_); }
  reject_reason reason() const { return reason_; }
  const std::string& message() const { return message_; }
  /// For version_mismatch: the peer's protocol version.
  std::uint16_t peer_version() const { return peer_version_; }

 private:
  friend decode_result decode_envelope(const std::vector<frame_view>&, const decode_limits&);
  std::unique_ptr<decoded_envelope> envelope_;
  reject_reason reason_ = reject_reason::malformed;
  std::string message_;
  std::uint16_t peer_version_ = 0;
};

/// Encoded bytes of one tensor frame, shared so the transport can hand them to
/// ZeroMQ without a copy and keep them alive until sent. Their owner may be
/// anything: a shard's fp32 fragment frame is its Θ itself, not a copy of it.
class shared_bytes {
 public:
  shared_bytes() = default;
  /// Bytes of their own.
  explicit shared_bytes(std::vector<std::uint8_t> bytes);
  /// `size` bytes at `data`, kept alive (and unchanged) by `owner`.
  shared_bytes(std::shared_ptr<const void> owner, const std::uint8_t* data, std::size_t size)
      : owner_(std::move(owner)), data_(data), size_(size) {}
  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::vector<std::uint8_t> copy() const { return {data_, data_ + size_}; }

 private:
  std::shared_ptr<const void> owner_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

/// An outbound message: the Envelope frame plus the tensor frames.
struct encoded_message {
  kj::Array<capnp::word> envelope;
  std::vector<shared_bytes> tensors;
  std::size_t total_bytes() const;
};

/// Builds one Envelope: set the body through body(), add tensors, finish().
class envelope_builder {
 public:
  /// `broker_epoch`: the newest broker epoch the sender knows (Header.brokerEpoch).
  envelope_builder(node_address sender, incarnation inc, std::uint64_t sequence, std::uint64_t round,
                   std::uint64_t broker_epoch = 0);
  wire::Envelope::Body::Builder body() { return root_.getBody(); }
  /// Adds an already encoded tensor frame; its length and checksum are computed here.
  void add_tensor(const std::string& name, tensor_encoding encoding, std::uint64_t element_count,
                  std::uint32_t block_size, shared_bytes bytes);
  /// Encodes `values` at `encoding` and adds the frame; non-finite values are invalid_input.
  status add_tensor_values(const std::string& name, const float* values, std::size_t count,
                           tensor_encoding encoding, std::uint32_t block_size = default_block_size);
  /// Adds `values` as an fp32 frame as they are: no copy, the message keeps them
  /// alive. They must be finite and stay unchanged (a shard's Θ of one version is).
  void add_fp32(const std::string& name, std::shared_ptr<const std::vector<float>> values);
  encoded_message finish();

 private:
  struct pending {
    std::string name;
    tensor_encoding encoding;
    std::uint64_t count;
    std::uint32_t block_size;
    shared_bytes bytes;
  };
  capnp::MallocMessageBuilder builder_;
  wire::Envelope::Builder root_;
  std::vector<pending> tensors_;
};

wire::Role to_wire(role r);
wire::NodeAddress::Builder set_address(wire::NodeAddress::Builder b, node_address a);

}  // namespace archipelago::transport
