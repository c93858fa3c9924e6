#include "learner/model/checkpoint.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/checksum.hpp"
#include "schemas/checkpoint.capnp.h"

namespace archipelago {
namespace {

constexpr char magic[8] = {'A', 'R', 'C', 'H', 'C', 'K', 'P', 'T'};
constexpr std::uint32_t format_version = 1;
constexpr std::uint64_t max_header_bytes = 1 << 20;

error corrupt(const std::string& path, const std::string& what) {
  return make_error(errc::corrupt_data, "checkpoint '" + path + "': " + what);
}

}  // namespace

expected<std::string> encode_checkpoint(const checkpoint& ckpt) {
  if (auto ok = validate(ckpt.shape); !ok) return ok.err();
  const param_layout layout = make_layout(ckpt.shape);
  if (ckpt.params.size() != layout.total_floats)
    return make_error(errc::internal, "checkpoint parameter count does not match the layout");

  capnp::MallocMessageBuilder builder;
  auto header = builder.initRoot<CheckpointHeader>();
  header.setFormatVersion(format_version);
  auto shape = header.initShape();
  shape.setVocab(ckpt.shape.vocab);
  shape.setContext(ckpt.shape.context);
  shape.setDModel(ckpt.shape.d_model);
  shape.setNLayer(ckpt.shape.n_layer);
  shape.setNHead(ckpt.shape.n_head);
  shape.setTied(ckpt.shape.tied);
  header.setLayoutFingerprint(layout.fingerprint());
  header.setParamFloats(ckpt.params.size());
  header.setPayloadChecksum(checksum64(ckpt.params.data(), ckpt.params.size() * sizeof(float)));
  header.setSteps(ckpt.steps);
  header.setTokens(ckpt.tokens);
  header.setTrainLoss(ckpt.train_loss);
  header.setEvalLoss(ckpt.eval_loss);
  header.setCorpus(ckpt.corpus);
  header.setSeed(ckpt.seed);
  const kj::Array<capnp::word> flat = capnp::messageToFlatArray(builder);
  const std::uint64_t header_bytes = flat.size() * sizeof(capnp::word);
  std::string out;
  out.reserve(sizeof magic + sizeof header_bytes + header_bytes + ckpt.params.size() * sizeof(float));
  out.append(magic, sizeof magic);
  out.append(reinterpret_cast<const char*>(&header_bytes), sizeof header_bytes);
  out.append(reinterpret_cast<const char*>(flat.begin()), header_bytes);
  out.append(reinterpret_cast<const char*>(ckpt.params.data()), ckpt.params.size() * sizeof(float));
  return out;
}

status save_checkpoint(const std::string& path, const checkpoint& ckpt) {
  auto bytes = encode_checkpoint(ckpt);
  if (!bytes) return bytes.err();
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) return status(make_error(errc::io_error, "cannot write checkpoint '" + temp + "'"));
    out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
    out.flush();
    if (!out) return status(make_error(errc::io_error, "error writing checkpoint '" + temp + "'"));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0)
    return status(make_error(errc::io_error, "cannot rename '" + temp + "' to '" + path + "'"));
  return {};
}

expected<checkpoint> decode_checkpoint(std::string_view bytes, const std::string& name) {
  std::uint64_t header_bytes = 0;
  if (bytes.size() < sizeof magic + sizeof header_bytes || std::memcmp(bytes.data(), magic, sizeof magic) != 0)
    return corrupt(name, "not an archipelago checkpoint (bad magic)");
  std::memcpy(&header_bytes, bytes.data() + sizeof magic, sizeof header_bytes);
  if (header_bytes == 0 || header_bytes % 8 != 0 || header_bytes > max_header_bytes)
    return corrupt(name, "implausible header length " + std::to_string(header_bytes));
  const std::string_view rest = bytes.substr(sizeof magic + sizeof header_bytes);
  if (rest.size() < header_bytes) return corrupt(name, "truncated header");
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(header_bytes / 8);
  std::memcpy(words.begin(), rest.data(), header_bytes);
  const std::string_view payload = rest.substr(header_bytes);

  checkpoint ckpt;
  std::uint64_t expected_checksum = 0;
  try {
    // One pass over the header, no amplification (as every reader of untrusted bytes here).
    capnp::ReaderOptions limits;
    limits.traversalLimitInWords = header_bytes / 8 + 64;
    limits.nestingLimit = 16;
    capnp::FlatArrayMessageReader reader(words, limits);
    auto header = reader.getRoot<CheckpointHeader>();
    if (header.getFormatVersion() != format_version)
      return make_error(errc::unsupported, "checkpoint '" + name + "' has format version " +
                                               std::to_string(header.getFormatVersion()) +
                                               ", this build reads " + std::to_string(format_version));
    auto s = header.getShape();
    ckpt.shape = {static_cast<int>(s.getVocab()), static_cast<int>(s.getContext()),
                  static_cast<int>(s.getDModel()), static_cast<int>(s.getNLayer()),
                  static_cast<int>(s.getNHead()), s.getTied()};
    if (auto ok = validate(ckpt.shape); !ok) return corrupt(name, ok.err().message);
    const param_layout layout = make_layout(ckpt.shape);
    if (header.getLayoutFingerprint() != layout.fingerprint())
      return corrupt(name, "layout fingerprint does not match its model shape");
    if (header.getParamFloats() != layout.total_floats)
      return corrupt(name, "parameter count does not match its model shape");
    // The payload is checked against the file before anything is allocated for it:
    // a shape a few header bytes can name may hold hundreds of gigabytes.
    if (payload.size() / sizeof(float) < layout.total_floats || payload.size() % sizeof(float) != 0)
      return corrupt(name, "truncated parameter payload (" + std::to_string(payload.size()) + " bytes; its shape needs " +
                               std::to_string(layout.total_floats * sizeof(float)) + ")");
    if (payload.size() / sizeof(float) > layout.total_floats) return corrupt(name, "trailing bytes after the payload");
    expected_checksum = header.getPayloadChecksum();
    ckpt.steps = header.getSteps();
    ckpt.tokens = header.getTokens();
    ckpt.train_loss = header.getTrainLoss();
    ckpt.eval_loss = header.getEvalLoss();
    ckpt.corpus = header.getCorpus();
    ckpt.seed = header.getSeed();
  } catch (const kj::Exception& e) {
    return corrupt(name, std::string("malformed header: ") + e.getDescription().cStr());
  }
  if (checksum64(payload.data(), payload.size()) != expected_checksum) return corrupt(name, "payload checksum mismatch");
  ckpt.params.resize(payload.size() / sizeof(float));
  std::memcpy(ckpt.params.data(), payload.data(), payload.size());
  return ckpt;
}

expected<checkpoint> load_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(errc::not_found, "checkpoint file '" + path + "' does not exist or is unreadable");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return make_error(errc::io_error, "checkpoint '" + path + "': read error");
  return decode_checkpoint(bytes, path);
}

}  // namespace archipelago
