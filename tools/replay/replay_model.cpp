// A version's model read back: evaluated, sampled, compared, exported.

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/json_line.hpp"
#include "replay/replay.hpp"

namespace archipelago {
namespace {

/// The tensor's shape as exported: a matrix (rows, cols); a vector (cols).
std::string shape_text(const tensor_spec& t, char open, char close) {
  if (!t.dims.empty()) {  // a layout file's tensor: its declared shape
    std::string out(1, open);
    for (std::size_t i = 0; i < t.dims.size(); ++i) out += (i ? "," : "") + std::to_string(t.dims[i]);
    return out + (t.dims.size() == 1 && open == '(' ? ",)" : std::string(1, close));
  }
  return t.rows == 1 && t.kind == tensor_kind::vector
             ? std::string(1, open) + std::to_string(t.cols) + (open == '(' ? ",)" : std::string(1, close))
             : std::string(1, open) + std::to_string(t.rows) + "," + std::to_string(t.cols) + close;
}

status write_file(const std::filesystem::path& path, const std::string& head, const float* data, std::size_t floats) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(head.data(), static_cast<std::streamsize>(head.size()));
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(floats * sizeof(float)));
  f.close();
  if (!f) return make_error(errc::io_error, "cannot write " + path.string());
  return {};
}

/// A mesh of a layout file (model.layout) trains a model the native engine cannot run.
error native_only(const char* what) {
  return make_error(errc::unsupported, std::string("replay ") + what + ": the mesh trained a model of its own "
                                       "(model.layout); only the native GPT can be run here (export it instead)");
}

/// One .npy file per tensor (format 1.0, little-endian float32, C order) in directory `out`.
status export_npy(const param_layout& layout, const std::vector<float>& params, const std::string& out) {
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return make_error(errc::io_error, "cannot create " + out + ": " + ec.message());
  for (const auto& t : layout.tensors) {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_text(t, '(', ')') + ", }";
    const std::size_t total = 10 + header.size() + 1;
    header.append((64 - total % 64) % 64, ' ');
    header += '\n';
    std::string head = "\x93NUMPY";
    head += '\x01';
    head += '\x00';
    head += static_cast<char>(header.size() & 0xff);
    head += static_cast<char>(header.size() >> 8);
    if (auto ok = write_file(std::filesystem::path(out) / (t.name + ".npy"), head + header, params.data() + t.offset, t.size()); !ok)
      return ok;
  }
  return {};
}

/// One safetensors file: le64 header length, a JSON header, then the tensors' bytes.
status export_safetensors(const param_layout& layout, const std::vector<float>& params, const std::string& out,
                          const std::string& label) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\",\"archipelago_version\":\"" + json_escape(label) + "\"}";
  std::vector<float> data;
  for (const auto& t : layout.tensors) {
    const std::size_t begin = data.size() * 4;
    data.insert(data.end(), params.begin() + static_cast<std::ptrdiff_t>(t.offset),
                params.begin() + static_cast<std::ptrdiff_t>(t.offset + t.size()));
    header += ",\"" + json_escape(t.name) + "\":{\"dtype\":\"F32\",\"shape\":" + shape_text(t, '[', ']') +
              ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(data.size() * 4) + "]}";
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string head(8, '\0');
  for (int i = 0; i < 8; ++i) head[i] = static_cast<char>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
  return write_file(out, head + header, data.data(), data.size());
}

/// One fragment's change from its state in manifest entry `a` to `b`.
expected<fragment_change> fragment_diff(const replay_store& s, const storage::manifest_entry& a,
                                        const storage::manifest_entry& b, double& a_sq) {
  auto fa = s.store->read_fragment(a.fragment, a.version);
  if (!fa) return fa.err();
  auto fb = s.store->read_fragment(b.fragment, b.version);
  if (!fb) return fb.err();
  double sq = 0, max_abs = 0;
  a_sq = 0;
  for (std::size_t i = 0; i < fa->theta.size() && i < fb->theta.size(); ++i) {
    const double d = static_cast<double>(fb->theta[i]) - fa->theta[i];
    sq += d * d;
    a_sq += static_cast<double>(fa->theta[i]) * fa->theta[i];
    max_abs = std::max(max_abs, std::abs(d));
  }
  return fragment_change{a.fragment, a.version, b.version, std::sqrt(sq), a_sq > 0 ? std::sqrt(sq / a_sq) : 0, max_abs};
}

}  // namespace

expected<std::vector<float>> params_of(const replay_store& s, std::uint64_t version) {
  auto m = s.store->read_manifest(version);
  if (!m) return m.err();
  return s.store->read_params(*m, s.setup.layout, s.setup.plan);
}

expected<eval_result> evaluate_params(const config& run_cfg, const mesh_setup& setup, const std::vector<float>& params,
                                      const std::string& corpus, int threads) {
  if (!setup.cfg.model.layout.empty()) return native_only("eval");
  config cfg = run_cfg;
  if (!corpus.empty()) cfg.data.corpus = corpus;
  auto data = load_dataset(cfg.data, 1, setup.shape.context, cfg.train.seed);
  if (!data) return data.err();
  set_compute_threads(threads);
  engine eval(cfg, setup.shape, *data, 0);
  std::copy(params.begin(), params.end(), eval.model().params());
  return eval.evaluate();
}

expected<std::string> sample_params(const mesh_setup& setup, const std::vector<float>& params,
                                    const sample_options& options, int threads) {
  if (!setup.cfg.model.layout.empty()) return native_only("sample");
  if (auto ok = validate(options); !ok) return ok.err();
  set_compute_threads(threads);
  gpt<float> model(setup.layout);
  std::copy(params.begin(), params.end(), model.params());
  return sample_text(model, options);
}

status export_params(const mesh_setup& setup, const std::vector<float>& params, const std::string& format,
                     const std::string& out, const std::string& label) {
  if (format == "npy") return export_npy(setup.layout, params, out);
  if (format == "safetensors") return export_safetensors(setup.layout, params, out, label);
  return make_error(errc::invalid_input, "unknown export format '" + format + "' (npy or safetensors)");
}

expected<eval_result> evaluate_version(const replay_store& s, std::uint64_t version, const std::string& corpus,
                                       int threads) {
  auto params = params_of(s, version);
  if (!params) return params.err();
  return evaluate_params(s.cfg, s.setup, *params, corpus, threads);
}

expected<std::string> sample_version(const replay_store& s, std::uint64_t version, const sample_options& options,
                                     int threads) {
  if (auto ok = validate(options); !ok) return ok.err();
  auto params = params_of(s, version);
  if (!params) return params.err();
  return sample_params(s.setup, *params, options, threads);
}

expected<model_change> diff_versions(const replay_store& s, std::uint64_t a, std::uint64_t b) {
  auto ma = s.store->read_manifest(a);
  if (!ma) return ma.err();
  auto mb = s.store->read_manifest(b);
  if (!mb) return mb.err();
  model_change out;
  double total_sq = 0, total_a_sq = 0;
  for (const auto& ea : ma->entries) {
    const storage::manifest_entry* eb = mb->find(ea.fragment);
    if (!eb) continue;
    double a_sq = 0;
    auto change = fragment_diff(s, ea, *eb, a_sq);
    if (!change) return change.err();
    total_sq += change->l2 * change->l2;
    total_a_sq += a_sq;
    out.fragments.push_back(*change);
  }
  out.l2 = std::sqrt(total_sq);
  out.relative = total_a_sq > 0 ? std::sqrt(total_sq / total_a_sq) : 0;
  return out;
}

status export_version(const replay_store& s, std::uint64_t version, const std::string& format, const std::string& out) {
  auto params = params_of(s, version);
  if (!params) return params.err();
  return export_params(s.setup, *params, format, out, std::to_string(version));
}

}  // namespace archipelago
