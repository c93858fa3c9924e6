#include "core/layout.hpp"

#include <cassert>

#include "core/checksum.hpp"

namespace archipelago {

const tensor_spec* param_layout::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::uint64_t param_layout::fingerprint() const {
  std::string text;
  for (const auto& t : tensors) {
    text += t.name;
    text += ':' + std::to_string(t.rows) + 'x' + std::to_string(t.cols) + '@' +
            std::to_string(t.offset) + ';';
  }
  return checksum64(text.data(), text.size());
}

status validate(const model_shape& s) {
  auto bad = [](std::string what) { return status(make_error(errc::invalid_input, std::move(what))); };
  if (s.vocab != 256) return bad("model vocab must be 256 (byte-level), got " + std::to_string(s.vocab));
  if (s.context < 2 || s.context > 4096)
    return bad("model.context must be in [2, 4096], got " + std::to_string(s.context));
  if (s.d_model < 2 || s.d_model > 8192)
    return bad("model.d_model must be in [2, 8192], got " + std::to_string(s.d_model));
  if (s.n_layer < 1 || s.n_layer > 256)
    return bad("model.n_layer must be in [1, 256], got " + std::to_string(s.n_layer));
  if (s.n_head < 1 || s.n_head > s.d_model || s.d_model % s.n_head != 0)
    return bad("model.n_head must divide model.d_model (" + std::to_string(s.d_model) + "), got " +
               std::to_string(s.n_head));
  return {};
}

param_layout make_layout(const model_shape& s) {
  assert(validate(s));
  param_layout layout;
  layout.shape = s;
  std::size_t offset = 0;
  auto add = [&](std::string name, int rows, int cols, tensor_kind kind) {
    tensor_spec t{std::move(name), rows, cols, offset, kind};
    offset += (t.size() + tensor_alignment_floats - 1) / tensor_alignment_floats *
              tensor_alignment_floats;
    layout.param_count += t.size();
    layout.tensors.push_back(std::move(t));
  };
  const int c = s.d_model;
  add("wte", s.vocab, c, tensor_kind::embedding);
  add("wpe", s.context, c, tensor_kind::embedding);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "h" + std::to_string(l) + ".";
    add(p + "ln1.g", 1, c, tensor_kind::vector);
    add(p + "ln1.b", 1, c, tensor_kind::vector);
    add(p + "attn.wqkv", c, 3 * c, tensor_kind::matrix);
    add(p + "attn.bqkv", 1, 3 * c, tensor_kind::vector);
    add(p + "attn.wo", c, c, tensor_kind::matrix);
    add(p + "attn.bo", 1, c, tensor_kind::vector);
    add(p + "ln2.g", 1, c, tensor_kind::vector);
    add(p + "ln2.b", 1, c, tensor_kind::vector);
    add(p + "mlp.w1", c, 4 * c, tensor_kind::matrix);
    add(p + "mlp.b1", 1, 4 * c, tensor_kind::vector);
    add(p + "mlp.w2", 4 * c, c, tensor_kind::matrix);
    add(p + "mlp.b2", 1, c, tensor_kind::vector);
  }
  add("lnf.g", 1, c, tensor_kind::vector);
  add("lnf.b", 1, c, tensor_kind::vector);
  if (!s.tied) add("lm_head", c, s.vocab, tensor_kind::embedding);
  layout.total_floats = offset;
  return layout;
}

namespace {
struct preset {
  const char* name;
  model_shape shape;
};
// vocab, context, d_model, n_layer, n_head, tied
const preset presets[] = {
    {"nano", {256, 64, 64, 2, 4, true}},      // 120,576 parameters
    {"micro", {256, 128, 160, 3, 5, true}},   // 989,600 parameters
    {"mini", {256, 128, 384, 6, 6, true}},    // 10,795,008 parameters
};
}  // namespace

const std::vector<std::string>& model_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& p : presets) out.emplace_back(p.name);
    return out;
  }();
  return names;
}

expected<model_shape> model_preset(const std::string& name) {
  for (const auto& p : presets)
    if (name == p.name) return p.shape;
  std::string known;
  for (const auto& p : presets) known += std::string(known.empty() ? "" : ", ") + p.name;
  return make_error(errc::invalid_input, "unknown model size '" + name + "' (known: " + known + ")");
}

}  // namespace archipelago
