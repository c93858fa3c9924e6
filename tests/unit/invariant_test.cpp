#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <string>

#include "core/error.hpp"
#include "core/invariant.hpp"

using namespace archipelago;

namespace {

/// Runs `body` in a child process with stderr on a pipe: how it ended, and what it wrote.
template <class F>
std::pair<int, std::string> in_child(F body) {
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(pipe_fds[1], STDERR_FILENO);
    close(pipe_fds[0]);
    body();
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string text;
  char buf[512];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return {status, text};
}

}  // namespace

TEST_CASE("a broken invariant logs its name and aborts, in the shipped (NDEBUG) build too") {
#ifdef NDEBUG
  MESSAGE("built with NDEBUG: assert would be compiled out here");
#endif
  const int steps = 0;
  auto [status, text] = in_child([&] { ARCHIPELAGO_INVARIANT(steps >= 1, "test: at least one step"); });
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
  CHECK(text.find(" error [invariant] invariant broken: test: at least one step (steps >= 1) at ") !=
        std::string::npos);
  CHECK(text.find("invariant_test.cpp:") != std::string::npos);
  CHECK(text.back() == '\n');
  CHECK(text.find('\n') == text.size() - 1);  // one line

  auto [held_status, held_text] = in_child([&] { ARCHIPELAGO_INVARIANT(steps == 0, "test: holds"); });
  CHECK(WIFEXITED(held_status));
  CHECK(WEXITSTATUS(held_status) == 0);
  CHECK(held_text.empty());
}

TEST_CASE("expected's value() of an error is a broken invariant, not undefined behaviour") {
  auto [status, text] = in_child([] {
    expected<int> e = make_error(errc::invalid_input, "no value");
    volatile int v = e.value();
    (void)v;
  });
  CHECK(WIFSIGNALED(status));
  CHECK(text.find("expected: value() of an error") != std::string::npos);
}
