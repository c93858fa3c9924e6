#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/layout.hpp"

using namespace archipelago;

TEST_CASE("presets have the documented parameter counts") {
  CHECK(make_layout(*model_preset("nano")).param_count == 120576);
  CHECK(make_layout(*model_preset("micro")).param_count == 989600);
  CHECK(make_layout(*model_preset("mini")).param_count == 10795008);
  CHECK(make_layout(*model_preset("small")).param_count == 49564160);
}

TEST_CASE("every tensor is 64-byte aligned, in order and non-overlapping") {
  for (const auto& name : model_preset_names()) {
    CAPTURE(name);
    for (bool tied : {true, false}) {
      model_shape s = *model_preset(name);
      s.tied = tied;
      const param_layout layout = make_layout(s);
      std::size_t end = 0;
      for (const auto& t : layout.tensors) {
        CHECK(t.offset % tensor_alignment_floats == 0);
        CHECK(t.offset >= end);
        end = t.offset + t.size();
      }
      CHECK(end <= layout.total_floats);
      CHECK(layout.total_floats % tensor_alignment_floats == 0);
      CHECK((layout.find("lm_head") != nullptr) == !tied);
    }
  }
}

TEST_CASE("the layout is a function of the shape alone") {
  const model_shape s{256, 32, 48, 3, 4, true};
  CHECK(make_layout(s).fingerprint() == make_layout(s).fingerprint());
  model_shape other = s;
  other.n_layer = 4;
  CHECK(make_layout(s).fingerprint() != make_layout(other).fingerprint());
}

TEST_CASE("invalid shapes are rejected with the field named") {
  model_shape s{256, 64, 64, 2, 5, true};
  auto r = validate(s);
  REQUIRE_FALSE(r);
  CHECK(r.err().code == errc::invalid_input);
  CHECK(r.err().message.find("n_head") != std::string::npos);
  CHECK_FALSE(model_preset("huge"));
  CHECK(model_preset("huge").err().message.find("unknown model size 'huge'") != std::string::npos);
}

TEST_CASE("fragment plans cover every tensor once and keep embeddings apart") {
  for (const auto& name : model_preset_names()) {
    CAPTURE(name);
    const param_layout layout = make_layout(*model_preset(name));
    for (int p : {1, 2, 3, 8, 24}) {
      CAPTURE(p);
      auto plan = make_fragment_plan(layout, p);
      REQUIRE(plan);
      REQUIRE(plan->fragments.size() == static_cast<std::size_t>(p));
      std::vector<int> seen(layout.tensors.size(), 0);
      std::size_t total = 0;
      for (std::size_t f = 0; f < plan->fragments.size(); ++f) {
        const auto& frag = plan->fragments[f];
        CHECK(!frag.tensors.empty());
        CHECK(std::is_sorted(frag.tensors.begin(), frag.tensors.end()));
        std::size_t floats = 0;
        for (std::size_t t : frag.tensors) {
          ++seen[t];
          floats += layout.tensors[t].size();
          CHECK(plan->fragment_of_tensor[t] == f);
          if (p >= 2) CHECK((layout.tensors[t].kind == tensor_kind::embedding) == frag.embedding);
        }
        CHECK(frag.floats == floats);
        total += floats;
      }
      CHECK(total == layout.param_count);
      for (int count : seen) CHECK(count == 1);
    }
    // Deterministic: the layout alone decides.
    CHECK(make_fragment_plan(layout, 24)->fragment_of_tensor == make_fragment_plan(layout, 24)->fragment_of_tensor);
  }
}

TEST_CASE("greedy packing balances equal tensors and refuses too many fragments") {
  const param_layout layout = make_layout(*model_preset("mini"));
  auto plan = make_fragment_plan(layout, 8);  // 2 embedding fragments + 6 for 6 identical blocks
  REQUIRE(plan);
  std::size_t lo = SIZE_MAX, hi = 0;
  for (const auto& f : plan->fragments)
    if (!f.embedding) lo = std::min(lo, f.floats), hi = std::max(hi, f.floats);
  CHECK(static_cast<double>(hi) / static_cast<double>(lo) < 1.05);
  CHECK_FALSE(make_fragment_plan(layout, 0));
  auto too_many = make_fragment_plan(layout, 1000);
  REQUIRE_FALSE(too_many);
  CHECK(too_many.err().code == errc::invalid_input);
}

TEST_CASE("a layout file gives named tensors with shapes, kinds and init laws") {
  const std::string text = R"({"tensors": [
    {"name": "embed.weight", "shape": [256, 16], "kind": "embedding", "init": {"normal": 0.5}},
    {"name": "conv.weight", "shape": [8, 16, 3], "init": {"uniform": 0.1}},
    {"name": "conv.bias", "shape": [8]},
    {"name": "norm.weight", "shape": [8], "init": {"constant": 1}}]})";
  auto layout = parse_layout_json(text, "test.json");
  REQUIRE(layout);
  REQUIRE(layout->tensors.size() == 4);
  CHECK(layout->tensors[1].rows == 8);
  CHECK(layout->tensors[1].cols == 48);
  CHECK(layout->tensors[1].kind == tensor_kind::matrix);
  CHECK(layout->tensors[2].kind == tensor_kind::vector);
  CHECK(layout->param_count == 256 * 16 + 8 * 48 + 8 + 8);
  for (const auto& t : layout->tensors) CHECK(t.offset % tensor_alignment_floats == 0);
  const auto params = initial_layout_params(*layout, 7);
  CHECK(params == initial_layout_params(*layout, 7));
  CHECK(params[layout->tensors[3].offset] == 1.f);
  CHECK(params[layout->tensors[2].offset] == 0.f);
  for (std::size_t i = 0; i < layout->tensors[1].size(); ++i)
    CHECK(std::abs(params[layout->tensors[1].offset + i]) <= 0.1f);
  // Embeddings get a fragment of their own, as the GPT's do.
  auto plan = make_fragment_plan(*layout, 2);
  REQUIRE(plan);
  CHECK(plan->fragments[plan->fragment_of_tensor[0]].embedding);
  // Round trip through layout_json keeps the fingerprint.
  auto again = parse_layout_json(layout_json(*layout), "again");
  REQUIRE(again);
  CHECK(again->fingerprint() == layout->fingerprint());
}

TEST_CASE("a layout file's differences change the fingerprint and are named") {
  auto a = parse_layout_json(R"({"tensors": [{"name": "w", "shape": [4, 8]}, {"name": "b", "shape": [8]}]})", "a");
  auto b = parse_layout_json(R"({"tensors": [{"name": "w", "shape": [8, 4]}, {"name": "b", "shape": [8]}]})", "b");
  auto c = parse_layout_json(R"({"tensors": [{"name": "w", "shape": [4, 8], "kind": "embedding"},
                                             {"name": "b", "shape": [8]}]})", "c");
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(c);
  CHECK(a->fingerprint() != b->fingerprint());
  CHECK(a->fingerprint() != c->fingerprint());
  CHECK(first_layout_difference(a->description(), b->description()) ==
        "tensor 0: 'w [4,8] matrix' in the mesh, 'w [8,4] matrix' in the joiner");
  CHECK(first_layout_difference(a->description(), a->description()).empty());
  CHECK(first_layout_difference(a->description(), "w [4,8] matrix\n") ==
        "tensor 1: 'b [8] vector' in the mesh, no tensor in the joiner");
}

TEST_CASE("a bad layout file is refused naming what is wrong") {
  auto refused = [](const std::string& text) {
    auto l = parse_layout_json(text, "f.json");
    REQUIRE_FALSE(l);
    return l.err().message;
  };
  CHECK(refused("{").find("not valid JSON") != std::string::npos);
  CHECK(refused(R"({"tensors": []})").find("at least one tensor") != std::string::npos);
  CHECK(refused(R"({"tensors": [{"name": "w", "shape": [4]}, {"name": "w", "shape": [4]}]})")
            .find("'w' is declared twice") != std::string::npos);
  CHECK(refused(R"({"tensors": [{"name": "w", "shape": [0]}]})").find("'w' has an extent") != std::string::npos);
  CHECK(refused(R"({"tensors": [{"name": "w", "shape": [4], "kind": "bias"}]})").find("kind 'bias'") !=
        std::string::npos);
  CHECK(refused(R"({"tensors": [{"name": "w", "shape": [4], "init": {"xavier": 1}}]})").find("law 'xavier'") !=
        std::string::npos);
  CHECK(load_layout_file("/nonexistent/layout.json").err().code == errc::not_found);
}
