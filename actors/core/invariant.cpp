#include "core/invariant.hpp"

#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace archipelago {

void invariant_failed(const char* name, const char* condition, const char* file, int line) noexcept {
  // No allocation and no logger: the process is in a state nobody planned for.
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);  // a wall-clock stamp for the line, as the logger's
  tm utc{};
  gmtime_r(&now.tv_sec, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &utc);
  char text[1024];
  const int n = std::snprintf(text, sizeof text, "%s.%03ldZ error [invariant] invariant broken: %s (%s) at %s:%d\n",
                              stamp, now.tv_nsec / 1000000, name, condition, file, line);
  if (n > 0) {
    std::size_t size = static_cast<std::size_t>(n);
    if (size >= sizeof text) {  // cut: still one line
      size = sizeof text - 1;
      text[size - 1] = '\n';
    }
    [[maybe_unused]] const auto written = ::write(STDERR_FILENO, text, size);
  }
  std::abort();
}

}  // namespace archipelago
