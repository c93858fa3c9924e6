// archipelago sample: generate text from a checkpoint.

#include <cstdio>
#include <memory>

#include "cli_common.hpp"
#include "commands.hpp"
#include "learner/model/checkpoint.hpp"
#include "learner/model/sampler.hpp"
#include "learner/model/trainer.hpp"

namespace archipelago::cli {
namespace {

struct sample_cli {
  std::string checkpoint_path;
  sample_options opts;
  int threads = 1;
  bool json = false;
};

int run_sample(const sample_cli& s) {
  if (auto ok = validate(s.opts); !ok) return report(ok.err());
  auto ckpt = load_checkpoint(s.checkpoint_path);
  if (!ckpt) return report(ckpt.err());
  set_compute_threads(s.threads);
  gpt<float> model(make_layout(ckpt->shape));
  std::copy(ckpt->params.begin(), ckpt->params.end(), model.params());
  const std::string text = sample_text(model, s.opts);
  std::printf("%s%s\n", s.opts.prompt.c_str(), text.c_str());
  if (s.json) {
    json_line j;
    j.add("command", "sample")
        .add("checkpoint", s.checkpoint_path)
        .add("prompt", s.opts.prompt)
        .add("text", text)
        .add("bytes", static_cast<std::int64_t>(text.size()))
        .add("temperature", s.opts.temperature)
        .add("seed", s.opts.seed);
    std::printf("%s\n", j.str().c_str());
  }
  return exit_ok;
}

}  // namespace

runner add_sample_command(CLI::App& app) {
  auto s = std::make_shared<sample_cli>();
  CLI::App* cmd = app.add_subcommand("sample", "Generate text from a trained checkpoint");
  cmd->add_option("--checkpoint", s->checkpoint_path, "Checkpoint written by train --out")->required();
  cmd->add_option("--prompt", s->opts.prompt, "Text to continue");
  cmd->add_option("--bytes", s->opts.bytes, "Bytes to generate (default 256)");
  cmd->add_option("--temperature", s->opts.temperature, "Sampling temperature > 0 (default 0.8)");
  cmd->add_option("--top-k", s->opts.top_k, "Sample among the k most likely bytes; 0 = all");
  cmd->add_option("--seed", s->opts.seed, "Sampling seed");
  cmd->add_option("--threads", s->threads, "Compute threads")->check(CLI::Range(1, 256));
  cmd->add_flag("--json", s->json, "Print a one-line JSON summary last");
  return [s](logger&) { return run_sample(*s); };
}

}  // namespace archipelago::cli
