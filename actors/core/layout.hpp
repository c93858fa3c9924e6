#pragma once
// The parameter layout: which tensors a model has, their shapes and where each
// lives in the one contiguous float buffer. It is derived from the model shape
// alone, so learners, parameter shards, storage and replay all compute the same
// layout without including the model.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
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

/// How a tensor of a layout file starts in the shards' initial global model.
struct tensor_init {
  enum class law : std::uint8_t { normal, uniform, constant };
  law kind = law::normal;
  float value = 0.02f;  // normal: the standard deviation; uniform: the bound (±); constant: the value
};

struct tensor_spec {
  std::string name;     // e.g. "h1.attn.wqkv"
  int rows = 0;         // for vectors rows == 1
  int cols = 0;
  std::size_t offset = 0;  // in floats from the start of the buffer; multiple of 16
  tensor_kind kind = tensor_kind::vector;
  /// A layout file's tensor: its declared shape (rows × cols is its 2-D view:
  /// rows = the first extent, cols = the product of the others). Empty for the GPT.
  std::vector<int> dims;
  tensor_init init;  // a layout file's tensor: its initial values

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
  /// A stable 64-bit fingerprint of names, shapes and offsets (and, for a layout
  /// file's tensors, their declared shapes and kinds, which the fragment plan follows).
  std::uint64_t fingerprint() const;
  /// One line per tensor, "name dims kind" (the GPT's: "name rowsxcols kind"):
  /// what a Join carries, so that a refusal can name the first difference.
  std::string description() const;
};

/// The first difference between two layouts' description() texts, e.g.
/// "tensor 3: 'fc1.weight' [64,32] matrix here, 'fc1.weight' [64,16] matrix there"; empty if equal.
std::string first_layout_difference(const std::string& here, const std::string& there);

/// A layout file: {"tensors": [{"name": "fc1.weight", "shape": [64, 32],
/// "kind": "matrix", "init": {"normal": 0.02}}, ...]}, float32 tensors in this
/// order. "kind" is embedding | matrix | vector (default: vector for one
/// dimension, matrix otherwise); "init" is {"normal": std}, {"uniform": bound}
/// or {"constant": value} (default: normal 0.02 for matrices and embeddings,
/// constant 0 for vectors). Errors (invalid_input, naming the tensor): no
/// tensors, a duplicate or empty name, a shape with an extent < 1 or more than
/// 2^31 values, an unknown kind or init law.
expected<param_layout> parse_layout_json(const std::string& text, const std::string& origin);
expected<param_layout> load_layout_file(const std::string& path);
/// A layout as a layout file's JSON (the GPT's too: its tensors with their 2-D shapes).
std::string layout_json(const param_layout& layout);

/// The initial values of a layout file's tensors (tensor_spec::init), seeded;
/// padding is zero. Deterministic from the layout and the seed alone.
std::vector<float> initial_layout_params(const param_layout& layout, std::uint64_t seed);

/// Which tensors make up each fragment, the unit of synchronisation, wire
/// transfer, outer-optimizer state and snapshot (docs/design/algorithm.md §3).
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

/// Which fragment a round's turn goes to (mesh.fragment_order; the broker decides).
enum class fragment_order : std::uint8_t {
  round_robin,  // turn r: fragment r mod P; a paused fragment's turn passes unused
  stalest,      // the fragment whose last round opened longest ago among those that can open now
  shuffled,     // each cycle of P turns visits every fragment once, in a seeded random order
};
const char* to_string(fragment_order order);
/// "round_robin", "stalest" or "shuffled"; nullopt for anything else.
std::optional<fragment_order> parse_fragment_order(std::string_view text);

/// Checks a shape's invariants and bounds; the error names the offending field.
status validate(const model_shape& shape);

/// The layout for a valid shape (asserts validity).
param_layout make_layout(const model_shape& shape);

/// Named presets: "nano" (~0.1 M), "micro" (~1 M), "mini" (~10 M),
/// "small" (~50 M parameters).
expected<model_shape> model_preset(const std::string& name);
const std::vector<std::string>& model_preset_names();

}  // namespace archipelago
