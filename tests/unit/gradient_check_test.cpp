// The hand-written backward pass against central finite differences, in double
// precision, for every tensor of every kind, tied and untied.

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "core/prng.hpp"
#include "learner/model/gpt.hpp"

using namespace archipelago;

namespace {

struct batch_data {
  std::vector<std::int32_t> inputs, targets;
};

batch_data random_batch(int batch, int context, std::uint64_t seed) {
  prng rng(seed);
  batch_data d;
  for (int i = 0; i < batch * context; ++i) {
    d.inputs.push_back(static_cast<std::int32_t>(rng.below(256)));
    d.targets.push_back(static_cast<std::int32_t>(rng.below(256)));
  }
  return d;
}

void check_gradients(const model_shape& shape, std::uint64_t seed) {
  CAPTURE(seed);
  CAPTURE(shape.tied);
  gpt<double> model(make_layout(shape));
  model.init(seed);
  // Non-trivial LayerNorm parameters and biases, so their gradients are exercised.
  prng rng(derive_seed(seed, 9));
  for (const auto& t : model.layout().tensors)
    if (t.kind == tensor_kind::vector)
      for (std::size_t k = 0; k < t.size(); ++k) model.params()[t.offset + k] += 0.1 * rng.normal();
  const int batch = 2;
  const batch_data data = random_batch(batch, shape.context, derive_seed(seed, 10));
  model.forward_backward(data.inputs.data(), data.targets.data(), batch);
  const std::vector<double> analytic(model.grads(), model.grads() + model.buffer_size());

  auto loss_at = [&](std::size_t index, double delta) {
    const double saved = model.params()[index];
    model.params()[index] = saved + delta;
    const double loss = model.forward_backward(data.inputs.data(), data.targets.data(), batch);
    model.params()[index] = saved;
    return loss;
  };

  const double h = 1e-5;
  for (const auto& t : model.layout().tensors) {
    CAPTURE(t.name);
    // A few seeded elements of every tensor (all of them for small vectors).
    const std::size_t probes = std::min<std::size_t>(t.size(), 6);
    for (std::size_t k = 0; k < probes; ++k) {
      const std::size_t element = t.size() <= 6 ? k : rng.below(t.size());
      // Embedding rows only receive gradient for tokens present; probe those.
      std::size_t index = t.offset + element;
      if (t.name == "wte") index = t.offset + static_cast<std::size_t>(data.inputs[k]) * shape.d_model + k % shape.d_model;
      CAPTURE(index);
      const double numeric = (loss_at(index, h) - loss_at(index, -h)) / (2 * h);
      const double a = analytic[index];
      const double tolerance = 1e-7 + 1e-5 * std::max(std::abs(a), std::abs(numeric));
      CHECK(std::abs(a - numeric) <= tolerance);
    }
  }

  // A random direction over all parameters at once: g·u against the directional derivative.
  std::vector<double> u(model.buffer_size(), 0.0);
  double predicted = 0;
  for (const auto& t : model.layout().tensors)
    for (std::size_t k = 0; k < t.size(); ++k) {
      u[t.offset + k] = rng.normal();
      predicted += analytic[t.offset + k] * u[t.offset + k];
    }
  std::vector<double> saved(model.params(), model.params() + model.buffer_size());
  auto shifted = [&](double eps) {
    for (std::size_t i = 0; i < u.size(); ++i) model.params()[i] = saved[i] + eps * u[i];
    return model.forward_backward(data.inputs.data(), data.targets.data(), batch);
  };
  const double eps = 1e-6;
  const double numeric = (shifted(eps) - shifted(-eps)) / (2 * eps);
  CHECK(numeric == doctest::Approx(predicted).epsilon(1e-6));
}

}  // namespace

TEST_CASE("gradients match finite differences: tied embeddings") {
  check_gradients({256, 8, 12, 2, 3, true}, 11);
}

TEST_CASE("gradients match finite differences: untied unembedding") {
  check_gradients({256, 6, 8, 1, 2, false}, 12);
}

TEST_CASE("gradients match finite differences: one head, one position edge") {
  check_gradients({256, 3, 4, 1, 1, true}, 13);
}
