#include <doctest/doctest.h>

#include "core/layout.hpp"

using namespace archipelago;

TEST_CASE("presets have the documented parameter counts") {
  CHECK(make_layout(*model_preset("nano")).param_count == 120576);
  CHECK(make_layout(*model_preset("micro")).param_count == 989600);
  CHECK(make_layout(*model_preset("mini")).param_count == 10795008);
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
