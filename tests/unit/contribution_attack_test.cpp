// The drills' malicious learner (learner/contribution_attack.hpp): what each
// attack kind does to a delta. Seeded: the same seed gives the same poison.

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "core/prng.hpp"
#include "learner/contribution_attack.hpp"

using namespace archipelago;

namespace {

std::vector<float> gaussian_delta(prng& rng, std::size_t n) {
  std::vector<float> d(n);
  for (auto& x : d) x = static_cast<float>(0.01 * rng.normal());
  return d;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  return dot(a, b) / std::sqrt(dot(a, a) * dot(b, b));
}

}  // namespace

TEST_CASE("attack: sideways keeps the honest norm at cosine factor with the honest delta, along one fixed direction") {
  prng rng(11);
  contribution_attacker attacker(42);
  const std::size_t n = 5000;
  std::vector<std::vector<float>> sent, honest;
  for (std::uint64_t r = 0; r < 4; ++r) {
    honest.push_back(gaussian_delta(rng, n));
    std::vector<float> d = honest.back();
    REQUIRE(attacker.apply(contribution_attack::sideways, 0.1, round_number{r * 24 + 3}, fragment_index{3}, d));
    CHECK(std::sqrt(dot(d, d)) == doctest::Approx(std::sqrt(dot(honest.back(), honest.back()))).epsilon(1e-4));
    CHECK(cosine(d, honest.back()) == doctest::Approx(0.1).epsilon(1e-3));
    sent.push_back(std::move(d));
  }
  // Round after round the same sideways direction: what the deltas share beyond
  // their honest parts (independent here) is that direction, so they agree.
  for (std::size_t a = 1; a < sent.size(); ++a) CHECK(cosine(sent[0], sent[a]) > 0.95);
  // Another fragment: another direction.
  std::vector<float> other = honest[0];
  REQUIRE(attacker.apply(contribution_attack::sideways, 0.1, round_number{4}, fragment_index{4}, other));
  CHECK(std::fabs(cosine(other, sent[0])) < 0.1);
  // factor 0: orthogonal to the honest delta.
  std::vector<float> orthogonal = honest[1];
  REQUIRE(attacker.apply(contribution_attack::sideways, 0, round_number{5}, fragment_index{3}, orthogonal));
  CHECK(std::fabs(cosine(orthogonal, honest[1])) < 1e-4);
  // A zero delta has no norm to keep: sent as it is.
  std::vector<float> zero(n, 0.f);
  CHECK_FALSE(attacker.apply(contribution_attack::sideways, 0.1, round_number{6}, fragment_index{3}, zero));
}

TEST_CASE("attack: stale sends the first delta under attack again, bit for bit") {
  prng rng(12);
  contribution_attacker attacker(7);
  std::vector<float> first = gaussian_delta(rng, 100), kept = first;
  CHECK_FALSE(attacker.apply(contribution_attack::stale, 1, round_number{1}, fragment_index{0}, kept));
  CHECK(kept == first);
  std::vector<float> later = gaussian_delta(rng, 100);
  CHECK(attacker.apply(contribution_attack::stale, 1, round_number{25}, fragment_index{0}, later));
  CHECK(later == first);
}

TEST_CASE("attack: sign flip, scaled and random") {
  prng rng(13);
  contribution_attacker attacker(9);
  const std::vector<float> honest = gaussian_delta(rng, 2000);
  std::vector<float> d = honest;
  REQUIRE(attacker.apply(contribution_attack::sign_flip, 1, round_number{1}, fragment_index{0}, d));
  CHECK(cosine(d, honest) == doctest::Approx(-1));
  d = honest;
  REQUIRE(attacker.apply(contribution_attack::scaled, 1000, round_number{1}, fragment_index{0}, d));
  CHECK(std::sqrt(dot(d, d)) == doctest::Approx(1000 * std::sqrt(dot(honest, honest))).epsilon(1e-4));
  d = honest;
  REQUIRE(attacker.apply(contribution_attack::random, 1, round_number{1}, fragment_index{0}, d));
  CHECK(std::fabs(cosine(d, honest)) < 0.1);
  CHECK(std::sqrt(dot(d, d)) == doctest::Approx(std::sqrt(dot(honest, honest))).epsilon(0.05));
}
