#pragma once
// The parameter layout: which tensors a model has, their shapes and where each
// lives in the one contiguous float buffer. It is derived from the model shape
// alone, so learners, parameter shards, storage and replay all compute the same
// layout without including the model.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace archipelago {

/// Shape of a byte-level decoder-only transformer.
struct model_shape {
  int vocab = 256;     // bytes
  int context = 64;    // T: positions per sequence
  int d_model = 64;    // C
  int n_layer = 2;     // L
  int n_head = 4;      // H; C % H == 0
  bool tied = true;    // unembedding shares the token embedding

  int head_dim() const { return d_model / n_head; }
  bool operator==(const model_shape&) const = default;
};

/// How a tensor is treated by the optimizers and the merge.
enum class tensor_kind : std::uint8_t {
  embedding,  // token/position embedding or unembedding: merged by weighted mean
  matrix,     // 2-D weight: weight decay applies
  vector,     // bias or LayerNorm gain/shift: no weight decay
};

struct tensor_spec {
  std::string name;     // e.g. "h1.attn.wqkv"
  int rows = 0;         // for vectors rows == 1
  int cols = 0;
  std::size_t offset = 0;  // in floats from the start of the buffer; multiple of 16
  tensor_kind kind = tensor_kind::vector;

  std::size_t size() const { return static_cast<std::size_t>(rows) * cols; }
  bool decays() const { return kind == tensor_kind::matrix; }
};

/// Alignment of every tensor inside the buffer: 16 floats = 64 bytes (one cache
/// line; AVX-512 aligned), so each tensor can be sent straight from memory.
inline constexpr std::size_t tensor_alignment_floats = 16;

struct param_layout {
  model_shape shape;
  std::vector<tensor_spec> tensors;
  std::size_t total_floats = 0;  // buffer length including alignment padding
  std::size_t param_count = 0;   // trainable parameters (no padding)

  const tensor_spec* find(const std::string& name) const;
  /// A stable 64-bit fingerprint of names, shapes and offsets.
  std::uint64_t fingerprint() const;
};

/// Which tensors make up each fragment, the unit of synchronisation, wire
/// transfer, outer-optimizer state and snapshot (ALGORITHM.md §3).
struct fragment_spec {
  std::vector<std::size_t> tensors;  // indices into param_layout::tensors, in layout order
  std::size_t floats = 0;            // parameters in the fragment (no padding)
  bool embedding = false;            // holds embedding/unembedding tensors only
};

struct fragment_plan {
  std::vector<fragment_spec> fragments;
  std::vector<std::uint32_t> fragment_of_tensor;  // per layout tensor
};

/// Balanced greedy bin-packing into `fragments` (P) fragments: tensors sorted by
/// size (descending, ties by name), each into the currently smallest fragment.
/// With P ≥ 2, embedding tensors get fragments of their own. Deterministic from
/// the layout alone. P larger than the tensors can fill is invalid_input.
expected<fragment_plan> make_fragment_plan(const param_layout& layout, int fragments);

/// Maps P fragments round-robin onto `shards` parameter shards: fragment p → p mod shards.
std::vector<std::uint32_t> round_robin_shards(int fragments, std::uint32_t shards);

/// Checks a shape's invariants and bounds; the error names the offending field.
status validate(const model_shape& shape);

/// The layout for a valid shape (asserts validity).
param_layout make_layout(const model_shape& shape);

/// Named presets: "nano" (~0.1 M), "micro" (~1 M), "mini" (~10 M parameters).
expected<model_shape> model_preset(const std::string& name);
const std::vector<std::string>& model_preset_names();

}  // namespace archipelago
