#pragma once
// What a bench is given by its caller besides its options: where its progress
// goes and how it learns that it should stop. The command line shows a live
// progress line and stops on SIGINT; a test passes nothing. So the measuring
// code owns no terminal and no signal handler.

#include <functional>
#include <string>

#include "core/error.hpp"
#include "core/log.hpp"

namespace archipelago {

struct bench_hooks {
  /// A status line, replaced by the next one (a terminal's live line).
  std::function<void(const std::string&)> progress;
  /// A status line that starts a stage (a run, a round): worth keeping in a
  /// log where the other progress lines are thinned out. Empty: `progress`.
  std::function<void(const std::string&)> stage;
  /// Polled between and during runs; true makes the bench return interrupted().
  std::function<bool()> stop;
  /// Where the meshes and transports a bench starts log (the process's logger).
  /// Required by the benches that start them (wire, snapshot, wan, ddp, ablate).
  logger* log = nullptr;

  void update(const std::string& text) const {
    if (progress) progress(text);
  }
  void begin(const std::string& text) const {
    if (stage) stage(text);
    else update(text);
  }
  bool stopped() const { return stop && stop(); }
};

/// What a bench returns when bench_hooks::stop said so.
inline error interrupted() { return make_error(errc::internal, "interrupted"); }

}  // namespace archipelago
