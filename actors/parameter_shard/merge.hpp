#pragma once
// The parameter shard's merge and outer optimizer for one fragment
// (docs/design/algorithm.md §6). Pure and deterministic: no clocks, threads or I/O, a fixed
// summation order (contributions in the order given), double accumulation, so
// every replay of a round produces bit-identical fragments.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "core/error.hpp"

namespace archipelago {

/// One tensor of a fragment: the contiguous range [offset, offset + size) of the
/// fragment's own flat float vector (offset relative to the fragment, not the
/// model). Ranges must lie inside the fragment and must not overlap; floats
/// covered by no tensor (padding) receive a zero update.
struct fragment_tensor {
  std::size_t offset = 0;
  std::size_t size = 0;
  bool embedding = false;      // token/position embedding or unembedding: weighted mean
  std::string_view name = {};  // for error messages only; must outlive the call
};

/// One learner's contribution to a fragment, already decoded to fp32.
struct contribution_view {
  const float* delta = nullptr;  // d_m = θ_m − anchor_m over the whole fragment
  double tokens = 0;             // c_tokens: tokens trained since the anchor, finite, ≥ 0
  double steps = 0;              // c_steps: inner steps since the anchor, finite, ≥ 1
};

/// "Quantity × quality": tokens · (tokens / steps) = tokens² / steps. A learner
/// with fewer tokens per step (smaller batch) counts less per step.
/// Precondition: steps ≥ 1 (merge_outer_gradient checks it and reports an error).
double merge_weight(double tokens, double steps);

/// RDA falls back to the weighted mean when the mean direction's norm is at or
/// below this fraction of the largest norm it could have (all non-zero
/// contributions aligned): the direction would be rounding noise.
inline constexpr double rda_cancellation_epsilon = 1e-9;

/// Merges the contributions into the fragment's outer gradient Δ (fp32, length
/// fragment_size, written to delta_out). With v_m = −d_m and w_m = merge_weight:
/// - embedding tensors: Δ = Σ w_m v_m / Σ w_m;
/// - other tensors, radial-directional averaging with u(x) = x / ‖x‖:
///   Δ = (Σ w_m ‖v_m‖ / Σ w_m) · u(Σ w_m u(v_m) / Σ w_m).
///   A zero v_m has direction zero: it adds nothing to the direction sum but its
///   weight stays in Σ w_m and its zero norm in the radius, so it shrinks the
///   update like a mean would (v and 0 with equal weights give v / 2). If the
///   mean direction vanishes (≤ rda_cancellation_epsilon relative, e.g. v and
///   −2v with equal weights, or all v_m zero) the tensor uses the weighted mean.
/// Errors (errc::invalid_input; delta_out is then untouched, except for the
/// fp32-overflow error which may leave it partially written): no contributions;
/// a null delta; tokens negative or non-finite; steps < 1 or non-finite; all
/// weights zero (or their sum overflows); a tensor outside the fragment or
/// overlapping another; a non-finite value (the message names the contribution
/// index, the tensor and the element); a merged value not representable in fp32.
///
/// With options.trim = t > 0 (mesh.robust), every weighted mean above becomes a
/// coordinate-wise trimmed one: per coordinate the t smallest and t largest values
/// are dropped (ties by contribution order) and the rest averaged with their
/// weights renormalised — the embedding mean over v_m, RDA's direction over
/// u(v_m) and its radius over ‖v_m‖. t is capped at (count − 1) / 2, so at least
/// one value stays: two contributions are never trimmed, three or four lose one
/// per side. The RDA fallback (directions cancel) takes the trimmed mean too.
struct merge_options {
  std::size_t trim = 0;
};

status merge_outer_gradient(std::span<const fragment_tensor> tensors,
                            std::span<const contribution_view> contributions,
                            std::size_t fragment_size, float* delta_out, const merge_options& options = {});

/// Outer optimizer hyper-parameters (docs/design/algorithm.md §2; these are DiLoCo's, the mesh's knobs set its own).
struct nesterov_config {
  double lr = 0.7;        // η_out: finite, ≥ 0
  double momentum = 0.9;  // μ: finite, in [0, 1)
  std::int64_t warmup = 0;  // outer steps over which η ramps linearly up to lr (0: none), ≥ 0
};

/// Checks the bounds above; the error names the offending field.
status validate(const nesterov_config& config);

/// SGD with Nesterov momentum over one fragment. Stateless apart from the
/// config: the momentum buffer b (fp32, one per fragment, zero-initialised by
/// the owner) lives with the fragment so it is snapshotted with it.
class outer_optimizer {
 public:
  /// The config must be valid (asserted; check it with validate first).
  explicit outer_optimizer(nesterov_config config);

  /// b ← μ·b + Δ;  Θ ← Θ − η_v·(Δ + μ·b), element-wise in double, stored in fp32, where
  /// v is the fragment's version (outer steps taken) before this one: η_v = lr·(v + 1)/warmup
  /// while v + 1 < warmup, else lr. The Θ update uses the stored (fp32) b, so replays from a
  /// snapshot agree.
  void step(float* theta, float* momentum_buffer, const float* delta, std::size_t n, std::uint64_t version) const;
  /// The same step into a new buffer: theta_out = the step from theta_in. theta_out may be
  /// `delta` itself (each element is read before it is written): the merge's output
  /// becomes the next version without a buffer more. Bit for bit the in-place step.
  void step_into(float* theta_out, const float* theta_in, float* momentum_buffer, const float* delta, std::size_t n,
                 std::uint64_t version) const;
  double lr_at(std::uint64_t version) const;

  const nesterov_config& config() const { return config_; }

 private:
  nesterov_config config_;
};

}  // namespace archipelago
