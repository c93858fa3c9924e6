#include "parameter_shard/robust_merge.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/checksum.hpp"

namespace archipelago {

status validate(const robust_config& config) {
  if (!std::isfinite(config.norm_factor) || config.norm_factor < 1)
    return make_error(errc::invalid_input,
                      "robust norm_factor " + std::to_string(config.norm_factor) + " (need finite, >= 1)");
  if (config.window < 1) return make_error(errc::invalid_input, "robust window 0 (need >= 1)");
  if (!(config.min_cosine >= -1 && config.min_cosine <= 1))
    return make_error(errc::invalid_input, "robust min_cosine " + std::to_string(config.min_cosine) + " (need in [-1, 1])");
  if (!(config.cosine_ratio >= 0 && config.cosine_ratio <= 1))
    return make_error(errc::invalid_input,
                      "robust cosine_ratio " + std::to_string(config.cosine_ratio) + " (need in [0, 1])");
  if (config.max_anchor_lag < 1) return make_error(errc::invalid_input, "robust max_anchor_lag 0 (need >= 1)");
  return status::ok();
}

double lower_median(std::vector<double> values) {
  if (values.empty()) return 0;
  const std::size_t k = (values.size() - 1) / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(k), values.end());
  return values[k];
}

const char* to_string(screen_decision::action a) {
  switch (a) {
    case screen_decision::action::accept: return "accept";
    case screen_decision::action::clip: return "clip";
    case screen_decision::action::reject: return "reject";
  }
  return "?";
}

const char* to_string(screen_decision::cause c) {
  switch (c) {
    case screen_decision::cause::none: return "none";
    case screen_decision::cause::stale_anchor: return "stale_anchor";
    case screen_decision::cause::replay: return "replay";
    case screen_decision::cause::norm: return "norm";
    case screen_decision::cause::direction: return "direction";
  }
  return "?";
}

namespace {

double norm_of(std::span<const float> v) {
  double squares = 0;
  for (float x : v) squares += static_cast<double>(x) * x;
  return std::sqrt(squares);
}

/// The cosine of `d` (of norm `d_norm`) with `reference` (of norm `reference_norm`); 0 for a zero vector.
double cosine(std::span<const float> d, double d_norm, const std::vector<double>& reference, double reference_norm) {
  if (d_norm == 0 || reference_norm == 0) return 0;
  double dot = 0;
  for (std::size_t i = 0; i < d.size(); ++i) dot += d[i] * reference[i];
  return dot / (d_norm * reference_norm);
}

double norm_of(const std::vector<double>& v) {
  double squares = 0;
  for (double x : v) squares += x * x;
  return std::sqrt(squares);
}

}  // namespace

direction_figures direction_cosines(std::span<const std::span<const float>> deltas, std::span<const float> momentum) {
  direction_figures out;
  out.with_median.assign(deltas.size(), 0.0);
  out.with_descent.assign(deltas.size(), 0.0);
  if (deltas.empty()) return out;
  const std::size_t n = deltas.front().size();
  std::vector<double> norms;
  for (auto d : deltas) norms.push_back(norm_of(d));
  if (deltas.size() >= min_round_reference) {
    // Each member against the coordinate-wise median of the *other* members' unit
    // vectors: one attacker of three or more cannot pull any coordinate past an
    // honest value, and no member agrees with a reference made of itself (with
    // noisy deltas that self-agreement would let a random one pass). One sort per
    // coordinate gives every member's leave-one-out median.
    const std::size_t count = deltas.size(), rest = count - 1;
    std::vector<double> column(count), dots(count, 0.0), reference_squares(count, 0.0);
    std::vector<std::size_t> order(count), rank(count);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t m = 0; m < count; ++m) column[m] = norms[m] > 0 ? deltas[m][i] / norms[m] : 0.0;
      for (std::size_t m = 0; m < count; ++m) order[m] = m;
      std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return column[a] < column[b]; });
      for (std::size_t k = 0; k < count; ++k) rank[order[k]] = k;
      for (std::size_t m = 0; m < count; ++m) {
        // The k-th smallest of the others: the k-th of all, or the next one past m's rank.
        auto others_kth = [&](std::size_t k) { return column[order[k < rank[m] ? k : k + 1]]; };
        const double median = rest % 2 == 1 ? others_kth(rest / 2) : (others_kth(rest / 2 - 1) + others_kth(rest / 2)) / 2;
        dots[m] += deltas[m][i] * median;
        reference_squares[m] += median * median;
      }
    }
    for (std::size_t m = 0; m < count; ++m) {
      if (norms[m] == 0 || reference_squares[m] == 0) continue;
      out.has_median = true;
      out.with_median[m] = dots[m] / (norms[m] * std::sqrt(reference_squares[m]));
    }
  }
  if (momentum.size() == n) {
    std::vector<double> descent(n);
    for (std::size_t i = 0; i < n; ++i) descent[i] = -static_cast<double>(momentum[i]);
    const double descent_norm = norm_of(descent);
    out.has_descent = descent_norm > 0;
    for (std::size_t m = 0; m < deltas.size(); ++m)
      out.with_descent[m] = cosine(deltas[m], norms[m], descent, descent_norm);
  }
  return out;
}

std::vector<screen_decision> fragment_screen::screen(std::span<const screen_member> members, std::uint64_t version,
                                                     std::span<const float> momentum) {
  std::vector<screen_decision> out(members.size());
  std::vector<std::uint64_t> digests(members.size(), 0);
  std::vector<std::size_t> kept;
  auto reject = [&](std::size_t m, screen_decision::cause why) {
    out[m].what = screen_decision::action::reject;
    out[m].why = why;
  };
  for (std::size_t m = 0; m < members.size(); ++m) {
    const screen_member& member = members[m];
    double squares = 0;  // finite: the shard refused non-finite values on arrival
    for (float x : member.delta) squares += static_cast<double>(x) * x;
    // Per √step: a learner back from a pause contributes many steps at once, and
    // its delta grows with them; a per-step figure would punish it for that.
    out[m].norm = std::sqrt(squares / static_cast<double>(std::max<std::uint64_t>(1, member.steps)));
    out[m].min_cosine = -1;
    if (member.anchor_version) {
      out[m].anchor_lag = static_cast<std::int64_t>(version) - static_cast<std::int64_t>(*member.anchor_version);
      // No learner can hold a version the shard has not published (durable before
      // visible); one far behind is an old contribution replayed, or work too stale to help.
      if (*member.anchor_version > version || version - *member.anchor_version > config_.max_anchor_lag) {
        reject(m, screen_decision::cause::stale_anchor);
        continue;
      }
    }
    if (squares > 0) {  // a zero delta carries nothing to replay (and honest ones may repeat)
      digests[m] = checksum64(member.delta.data(), member.delta.size_bytes());
      const bool seen = std::find(digests_.begin(), digests_.end(), digests[m]) != digests_.end() ||
                        std::any_of(kept.begin(), kept.end(), [&](std::size_t k) { return digests[k] == digests[m]; });
      if (seen) {
        reject(m, screen_decision::cause::replay);
        continue;
      }
    }
    kept.push_back(m);
  }
  // A round of 3 or more fresh members is its own reference: its figures are trusted.
  const bool trusted = kept.size() >= min_round_reference;
  screen_norms(kept, trusted, out);
  std::erase_if(kept, [&](std::size_t m) { return out[m].what == screen_decision::action::reject; });
  std::vector<double> descent_cosines(members.size(), std::nan(""));
  if (config_.min_cosine > -1 && !kept.empty()) screen_directions(members, kept, momentum, out, descent_cosines);
  std::erase_if(kept, [&](std::size_t m) { return out[m].what == screen_decision::action::reject; });

  // What was merged: its digests, and in a trusted round, its figures.
  auto remember = [this](std::deque<double>& window, double value) {
    window.push_back(value);
    while (window.size() > config_.window) window.pop_front();
  };
  for (std::size_t m : kept) {
    if (digests[m] != 0) {
      digests_.push_back(digests[m]);
      if (digests_.size() > replay_window) digests_.pop_front();
    }
    if (!trusted) continue;
    remember(norms_, out[m].norm);
    if (std::isfinite(descent_cosines[m])) remember(descent_cosines_, descent_cosines[m]);
  }
  return out;
}

void fragment_screen::screen_norms(std::span<const std::size_t> kept, bool own_reference,
                                   std::vector<screen_decision>& out) const {
  if (kept.empty()) return;
  // A round of 3 or more members is its own reference. A smaller one has too few
  // to outvote one attacker: the fragment's trusted figures join it — the newest
  // ones, which lag the warm-up's growing norms by one round at most.
  std::vector<double> reference;
  for (std::size_t m : kept) reference.push_back(out[m].norm);
  if (!own_reference) reference.insert(reference.end(), norms_.begin(), norms_.end());
  // One value alone is its own median: it would always pass, so say so plainly.
  if (reference.size() < 2) return;
  const double bound = config_.norm_factor * lower_median(std::move(reference));
  for (std::size_t m : kept) {
    screen_decision& d = out[m];
    d.norm_bound = bound;
    if (d.norm <= bound) continue;
    d.what = config_.clip && bound > 0 ? screen_decision::action::clip : screen_decision::action::reject;
    d.why = screen_decision::cause::norm;
  }
}

void fragment_screen::screen_directions(std::span<const screen_member> members, std::span<const std::size_t> kept,
                                        std::span<const float> momentum, std::vector<screen_decision>& out,
                                        std::vector<double>& descent_cosines) const {
  std::vector<std::span<const float>> deltas;
  for (std::size_t m : kept) deltas.push_back(members[m].delta);
  const direction_figures figures = direction_cosines(deltas, momentum);
  if (figures.has_descent)
    for (std::size_t i = 0; i < kept.size(); ++i) descent_cosines[kept[i]] = figures.with_descent[i];
  // The reference: the other members' median direction, else the fragment's descent; the
  // honest level of agreement with it: the lower median of the round's cosines
  // (one attacker of 3 or more cannot move it), else of the fragment's trusted ones.
  const bool by_median = figures.has_median;
  if (!by_median && !figures.has_descent) return;  // a fragment's first round, alone: nothing to compare with
  const std::vector<double>& cosines = by_median ? figures.with_median : figures.with_descent;
  std::optional<double> level;
  if (by_median) level = lower_median(cosines);
  else if (!descent_cosines_.empty()) level = lower_median({descent_cosines_.begin(), descent_cosines_.end()});
  // Members that do not agree at all (non-IID learners near their common optimum
  // pull apart: each one's delta points against the others') give no direction to
  // hold anyone to; one attacker cannot make the level non-positive on its own.
  if (level && *level <= 0) {
    for (std::size_t i = 0; i < kept.size(); ++i) out[kept[i]].cosine = cosines[i];
    return;
  }
  const double bound = std::max(config_.min_cosine, config_.cosine_ratio * level.value_or(0));
  for (std::size_t i = 0; i < kept.size(); ++i) {
    screen_decision& d = out[kept[i]];
    d.cosine = cosines[i];
    d.min_cosine = bound;
    if (d.cosine >= bound) continue;
    d.what = screen_decision::action::reject;  // a direction is not fixed by scaling: never clipped
    d.why = screen_decision::cause::direction;
  }
}

}  // namespace archipelago
