#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "core/prng.hpp"

using namespace archipelago;

TEST_CASE("prng streams are reproducible and independent") {
  prng a(42), b(42), c(43);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const auto x = a.next();
    CHECK(x == b.next());
    differs |= x != c.next();
  }
  CHECK(differs);
  CHECK(derive_seed(1, 2) != derive_seed(1, 3));
  CHECK(derive_seed(1, 2) == derive_seed(1, 2));
}

TEST_CASE("prng distributions have the right moments") {
  const std::uint64_t seed = 2024;
  CAPTURE(seed);
  prng rng(seed);
  const int n = 200000;
  double sum = 0, sq = 0;
  std::vector<int> buckets(10, 0);
  for (int i = 0; i < n; ++i) {
    const double z = rng.normal();
    sum += z;
    sq += z * z;
    const auto k = rng.below(10);
    REQUIRE(k < 10);
    ++buckets[k];
    const double u = rng.uniform();
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
  }
  CHECK(std::abs(sum / n) < 0.01);
  CHECK(std::abs(sq / n - 1.0) < 0.02);
  for (int count : buckets) CHECK(std::abs(count - n / 10) < n / 100);
}

TEST_CASE("errors carry a code, a reaction and a one-line message") {
  const error e = make_error(errc::corrupt_data, "checksum mismatch in fragment 3");
  CHECK(e.how() == reaction::stop);
  CHECK(e.to_string() == "corrupt data: checksum mismatch in fragment 3");
  CHECK(reaction_for(errc::timeout) == reaction::retry_call);
  CHECK(reaction_for(errc::disconnected) == reaction::retry_round);
  CHECK(reaction_for(errc::invalid_input) == reaction::fix_input);
  expected<int> v = 3;
  CHECK(v.has_value());
  CHECK(*v == 3);
  expected<int> failed = make_error(errc::not_found, "x");
  CHECK_FALSE(failed);
  CHECK(failed.err().code == errc::not_found);
}
