#include "core/layout.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/checksum.hpp"
#include "core/invariant.hpp"
#include "core/prng.hpp"

namespace archipelago {

const tensor_spec* param_layout::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {

const char* kind_name(tensor_kind k) {
  switch (k) {
    case tensor_kind::embedding: return "embedding";
    case tensor_kind::matrix: return "matrix";
    case tensor_kind::vector: return "vector";
  }
  return "?";
}

std::string dims_text(const tensor_spec& t) {
  if (t.dims.empty()) return std::to_string(t.rows) + 'x' + std::to_string(t.cols);
  std::string out = "[";
  for (std::size_t i = 0; i < t.dims.size(); ++i) out += (i ? "," : "") + std::to_string(t.dims[i]);
  return out + ']';
}

}  // namespace

std::uint64_t param_layout::fingerprint() const {
  std::string text;
  for (const auto& t : tensors) {
    text += t.name;
    text += ':' + std::to_string(t.rows) + 'x' + std::to_string(t.cols) + '@' +
            std::to_string(t.offset) + ';';
    // Only a layout file's tensors add these, so that the GPT's fingerprint (in
    // snapshots and checkpoints) stays what it was.
    if (!t.dims.empty()) text += dims_text(t) + kind_name(t.kind) + ';';
  }
  return checksum64(text.data(), text.size());
}

std::string param_layout::description() const {
  std::string out;
  for (const auto& t : tensors) out += t.name + ' ' + dims_text(t) + ' ' + kind_name(t.kind) + '\n';
  return out;
}

std::string first_layout_difference(const std::string& here, const std::string& there) {
  auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  };
  const auto a = lines(here), b = lines(there);
  for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string x = i < a.size() ? "'" + a[i] + "'" : "no tensor";
    const std::string y = i < b.size() ? "'" + b[i] + "'" : "no tensor";
    if (x != y) return "tensor " + std::to_string(i) + ": " + x + " in the mesh, " + y + " in the joiner";
  }
  return {};
}

namespace {

void append_tensor(param_layout& layout, tensor_spec t) {
  t.offset = layout.total_floats;
  layout.total_floats += (t.size() + tensor_alignment_floats - 1) / tensor_alignment_floats * tensor_alignment_floats;
  layout.param_count += t.size();
  layout.tensors.push_back(std::move(t));
}

}  // namespace

expected<param_layout> parse_layout_json(const std::string& text, const std::string& origin) {
  using json = nlohmann::json;
  auto bad = [&](const std::string& what) { return make_error(errc::invalid_input, origin + ": " + what); };
  const json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded()) return bad("not valid JSON");
  if (!doc.is_object() || !doc.contains("tensors") || !doc["tensors"].is_array() || doc["tensors"].empty())
    return bad("expected {\"tensors\": [ ... ]} with at least one tensor");
  param_layout layout;
  for (const json& e : doc["tensors"]) {
    const std::string where = "tensor " + std::to_string(layout.tensors.size());
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || e["name"].get<std::string>().empty())
      return bad(where + " has no name");
    tensor_spec t;
    t.name = e["name"].get<std::string>();
    if (layout.find(t.name)) return bad("tensor '" + t.name + "' is declared twice");
    if (!e.contains("shape") || !e["shape"].is_array() || e["shape"].empty())
      return bad("tensor '" + t.name + "' has no shape (a list of extents)");
    std::uint64_t count = 1;
    for (const json& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 1 || d.get<std::int64_t>() > (1LL << 31))
        return bad("tensor '" + t.name + "' has an extent that is not an integer >= 1");
      t.dims.push_back(d.get<int>());
      count *= static_cast<std::uint64_t>(t.dims.back());
      if (count > (1ULL << 31)) return bad("tensor '" + t.name + "' has more than 2^31 values");
    }
    t.rows = t.dims.size() == 1 ? 1 : t.dims[0];
    t.cols = static_cast<int>(count / static_cast<std::uint64_t>(t.rows));
    t.kind = t.dims.size() == 1 ? tensor_kind::vector : tensor_kind::matrix;
    if (e.contains("kind")) {
      const std::string k = e["kind"].is_string() ? e["kind"].get<std::string>() : "";
      if (k == "embedding") t.kind = tensor_kind::embedding;
      else if (k == "matrix") t.kind = tensor_kind::matrix;
      else if (k == "vector") t.kind = tensor_kind::vector;
      else return bad("tensor '" + t.name + "' has kind '" + k + "' (known: embedding, matrix, vector)");
    }
    t.init = t.kind == tensor_kind::vector ? tensor_init{tensor_init::law::constant, 0.f} : tensor_init{};
    if (e.contains("init")) {
      const json& i = e["init"];
      if (!i.is_object() || i.size() != 1 || !i.begin().value().is_number())
        return bad("tensor '" + t.name + "' has an init that is not {\"normal\"|\"uniform\"|\"constant\": number}");
      const std::string law = i.begin().key();
      const auto value = i.begin().value().get<double>();
      if (law == "normal") t.init = {tensor_init::law::normal, static_cast<float>(value)};
      else if (law == "uniform") t.init = {tensor_init::law::uniform, static_cast<float>(value)};
      else if (law == "constant") t.init = {tensor_init::law::constant, static_cast<float>(value)};
      else return bad("tensor '" + t.name + "' has init law '" + law + "' (known: normal, uniform, constant)");
    }
    append_tensor(layout, std::move(t));
  }
  return layout;
}

expected<param_layout> load_layout_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(errc::not_found, "cannot read the layout file " + path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_layout_json(text.str(), path);
}

std::string layout_json(const param_layout& layout) {
  using json = nlohmann::json;
  json tensors = json::array();
  for (const auto& t : layout.tensors) {
    json e;
    e["name"] = t.name;
    e["shape"] = t.dims.empty() ? (t.rows == 1 && t.kind == tensor_kind::vector ? json::array({t.cols})
                                                                                 : json::array({t.rows, t.cols}))
                                : json(t.dims);
    e["kind"] = kind_name(t.kind);
    if (!t.dims.empty()) {
      const char* law = t.init.kind == tensor_init::law::normal    ? "normal"
                        : t.init.kind == tensor_init::law::uniform ? "uniform"
                                                                   : "constant";
      e["init"] = {{law, t.init.value}};
    }
    tensors.push_back(std::move(e));
  }
  return json{{"tensors", tensors}}.dump(1);
}

std::vector<float> initial_layout_params(const param_layout& layout, std::uint64_t seed) {
  std::vector<float> out(layout.total_floats, 0.f);
  for (std::size_t i = 0; i < layout.tensors.size(); ++i) {
    const tensor_spec& t = layout.tensors[i];
    prng rng(derive_seed(seed, 7000 + i));
    float* p = out.data() + t.offset;
    for (std::size_t k = 0; k < t.size(); ++k) {
      switch (t.init.kind) {
        case tensor_init::law::normal: p[k] = static_cast<float>(rng.normal() * t.init.value); break;
        case tensor_init::law::uniform: p[k] = static_cast<float>((2 * rng.uniform() - 1) * t.init.value); break;
        case tensor_init::law::constant: p[k] = t.init.value; break;
      }
    }
  }
  return out;
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
  ARCHIPELAGO_INVARIANT(validate(s), "layout: a validated model shape");
  param_layout layout;
  layout.shape = s;
  auto add = [&](std::string name, int rows, int cols, tensor_kind kind) {
    tensor_spec t;
    t.name = std::move(name);
    t.rows = rows;
    t.cols = cols;
    t.kind = kind;
    append_tensor(layout, std::move(t));
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
  return layout;
}

namespace {

/// Greedy bin-packing of `items` (tensor indices) into `bins` fragments, appended to `plan`.
void pack(const param_layout& layout, std::vector<std::size_t> items, int bins, bool embedding,
          fragment_plan& plan) {
  std::sort(items.begin(), items.end(), [&](std::size_t a, std::size_t b) {
    const auto& ta = layout.tensors[a];
    const auto& tb = layout.tensors[b];
    return ta.size() != tb.size() ? ta.size() > tb.size() : ta.name < tb.name;
  });
  const std::size_t first = plan.fragments.size();
  for (int i = 0; i < bins; ++i) plan.fragments.push_back({{}, 0, embedding});
  for (std::size_t t : items) {
    std::size_t smallest = first;
    for (std::size_t f = first; f < plan.fragments.size(); ++f)
      if (plan.fragments[f].floats < plan.fragments[smallest].floats) smallest = f;
    plan.fragments[smallest].tensors.push_back(t);
    plan.fragments[smallest].floats += layout.tensors[t].size();
    plan.fragment_of_tensor[t] = static_cast<std::uint32_t>(smallest);
  }
  for (std::size_t f = first; f < plan.fragments.size(); ++f)
    std::sort(plan.fragments[f].tensors.begin(), plan.fragments[f].tensors.end());
}

}  // namespace

expected<fragment_plan> make_fragment_plan(const param_layout& layout, int fragments) {
  std::vector<std::size_t> embedding, other;
  for (std::size_t i = 0; i < layout.tensors.size(); ++i)
    (layout.tensors[i].kind == tensor_kind::embedding ? embedding : other).push_back(i);
  if (fragments < 1 || static_cast<std::size_t>(fragments) > layout.tensors.size())
    return make_error(errc::invalid_input, "the number of fragments must be in [1, " +
                                               std::to_string(layout.tensors.size()) +
                                               "] (the model's tensors), got " + std::to_string(fragments));
  fragment_plan plan;
  plan.fragment_of_tensor.assign(layout.tensors.size(), 0);
  if (fragments == 1) {
    std::vector<std::size_t> all(layout.tensors.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
    pack(layout, std::move(all), 1, false, plan);
    return plan;
  }
  const int embedding_bins = static_cast<int>(std::min<std::size_t>(embedding.size(), fragments - 1));
  const int other_bins = fragments - embedding_bins;
  if (static_cast<std::size_t>(other_bins) > other.size())
    return make_error(errc::invalid_input, std::to_string(fragments) + " fragments leave " +
                                               std::to_string(other_bins) + " for " +
                                               std::to_string(other.size()) +
                                               " non-embedding tensors; use at most " +
                                               std::to_string(other.size() + embedding_bins));
  pack(layout, std::move(other), other_bins, false, plan);
  pack(layout, std::move(embedding), embedding_bins, true, plan);
  return plan;
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
    {"small", {256, 256, 640, 10, 10, true}},  // 49,564,160 parameters
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

std::vector<std::uint32_t> round_robin_shards(int fragments, std::uint32_t shards) {
  std::vector<std::uint32_t> out;
  for (int p = 0; p < fragments; ++p) out.push_back(shards == 0 ? 0 : static_cast<std::uint32_t>(p) % shards);
  return out;
}

const char* to_string(fragment_order order) {
  switch (order) {
    case fragment_order::round_robin: return "round_robin";
    case fragment_order::stalest: return "stalest";
    case fragment_order::shuffled: return "shuffled";
  }
  return "unknown";
}

std::optional<fragment_order> parse_fragment_order(std::string_view text) {
  for (fragment_order o : {fragment_order::round_robin, fragment_order::stalest, fragment_order::shuffled})
    if (text == to_string(o)) return o;
  return std::nullopt;
}

}  // namespace archipelago
