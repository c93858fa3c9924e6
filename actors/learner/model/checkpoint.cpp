#include "learner/model/checkpoint.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstdio>
#include <cstring>
#include <fstream>

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

status save_checkpoint(const std::string& path, const checkpoint& ckpt) {
  if (auto ok = validate(ckpt.shape); !ok) return ok;
  const param_layout layout = make_layout(ckpt.shape);
  if (ckpt.params.size() != layout.total_floats)
    return status(make_error(errc::internal, "checkpoint parameter count does not match the layout"));

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

  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) return status(make_error(errc::io_error, "cannot write checkpoint '" + temp + "'"));
    out.write(magic, sizeof magic);
    out.write(reinterpret_cast<const char*>(&header_bytes), sizeof header_bytes);
    out.write(reinterpret_cast<const char*>(flat.begin()), static_cast<std::streamsize>(header_bytes));
    out.write(reinterpret_cast<const char*>(ckpt.params.data()),
              static_cast<std::streamsize>(ckpt.params.size() * sizeof(float)));
    out.flush();
    if (!out) return status(make_error(errc::io_error, "error writing checkpoint '" + temp + "'"));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0)
    return status(make_error(errc::io_error, "cannot rename '" + temp + "' to '" + path + "'"));
  return {};
}

expected<checkpoint> load_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(errc::not_found, "checkpoint file '" + path + "' does not exist or is unreadable");
  char head[8];
  std::uint64_t header_bytes = 0;
  in.read(head, sizeof head);
  in.read(reinterpret_cast<char*>(&header_bytes), sizeof header_bytes);
  if (!in || std::memcmp(head, magic, sizeof magic) != 0)
    return corrupt(path, "not an archipelago checkpoint (bad magic)");
  if (header_bytes == 0 || header_bytes % 8 != 0 || header_bytes > max_header_bytes)
    return corrupt(path, "implausible header length " + std::to_string(header_bytes));
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(header_bytes / 8);
  in.read(reinterpret_cast<char*>(words.begin()), static_cast<std::streamsize>(header_bytes));
  if (!in) return corrupt(path, "truncated header");

  checkpoint ckpt;
  std::uint64_t expected_checksum = 0;
  try {
    capnp::FlatArrayMessageReader reader(words);
    auto header = reader.getRoot<CheckpointHeader>();
    if (header.getFormatVersion() != format_version)
      return make_error(errc::unsupported, "checkpoint '" + path + "' has format version " +
                                               std::to_string(header.getFormatVersion()) +
                                               ", this build reads " + std::to_string(format_version));
    auto s = header.getShape();
    ckpt.shape = {static_cast<int>(s.getVocab()), static_cast<int>(s.getContext()),
                  static_cast<int>(s.getDModel()), static_cast<int>(s.getNLayer()),
                  static_cast<int>(s.getNHead()), s.getTied()};
    if (auto ok = validate(ckpt.shape); !ok) return corrupt(path, ok.err().message);
    const param_layout layout = make_layout(ckpt.shape);
    if (header.getLayoutFingerprint() != layout.fingerprint())
      return corrupt(path, "layout fingerprint does not match its model shape");
    if (header.getParamFloats() != layout.total_floats)
      return corrupt(path, "parameter count does not match its model shape");
    expected_checksum = header.getPayloadChecksum();
    ckpt.steps = header.getSteps();
    ckpt.tokens = header.getTokens();
    ckpt.train_loss = header.getTrainLoss();
    ckpt.eval_loss = header.getEvalLoss();
    ckpt.corpus = header.getCorpus();
    ckpt.seed = header.getSeed();
    ckpt.params.resize(layout.total_floats);
  } catch (const kj::Exception& e) {
    return corrupt(path, std::string("malformed header: ") + e.getDescription().cStr());
  }
  in.read(reinterpret_cast<char*>(ckpt.params.data()),
          static_cast<std::streamsize>(ckpt.params.size() * sizeof(float)));
  if (!in) return corrupt(path, "truncated parameter payload");
  if (in.peek() != std::char_traits<char>::eof()) return corrupt(path, "trailing bytes after the payload");
  if (checksum64(ckpt.params.data(), ckpt.params.size() * sizeof(float)) != expected_checksum)
    return corrupt(path, "payload checksum mismatch");
  return ckpt;
}

}  // namespace archipelago
