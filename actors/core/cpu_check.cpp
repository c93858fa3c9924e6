// Refuses to start on a CPU that lacks the instructions this build was compiled
// for, with one clear line instead of a SIGILL somewhere later.
//
// This file alone is compiled for the baseline x86-64 ISA, and the check runs
// as a high-priority constructor: before any other static initializer, whose
// code may already use AVX2.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

namespace {

void refuse(const char* missing) {
  std::fprintf(stderr,
               "archipelago: this CPU lacks %s, which this build (-march=%s) requires; "
               "rebuild with -DARCHIPELAGO_MARCH=x86-64-v3 on an AVX2 machine\n",
               missing, ARCHIPELAGO_BUILD_MARCH);
  _exit(1);
}

bool supports(const char* feature) {
  // __builtin_cpu_supports needs a literal; map the few names we check.
#define ARCHIPELAGO_FEATURE(name) \
  if (std::strcmp(feature, #name) == 0) return __builtin_cpu_supports(#name);
  ARCHIPELAGO_FEATURE(avx2)
  ARCHIPELAGO_FEATURE(fma)
  ARCHIPELAGO_FEATURE(bmi2)
  ARCHIPELAGO_FEATURE(avx512f)
  ARCHIPELAGO_FEATURE(avx512bw)
  ARCHIPELAGO_FEATURE(avx512dq)
  ARCHIPELAGO_FEATURE(avx512vl)
  ARCHIPELAGO_FEATURE(avx512bf16)
  ARCHIPELAGO_FEATURE(avx512fp16)
  ARCHIPELAGO_FEATURE(avx512vnni)
#undef ARCHIPELAGO_FEATURE
  return false;
}

__attribute__((constructor(101))) void check_cpu() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("x86-64-v3")) refuse("the x86-64-v3 level (AVX2, FMA, BMI2)");
#ifdef ARCHIPELAGO_NATIVE_FEATURES
  char list[256];
  std::snprintf(list, sizeof list, "%s", ARCHIPELAGO_NATIVE_FEATURES);
  for (char* f = std::strtok(list, ","); f != nullptr; f = std::strtok(nullptr, ","))
    if (!supports(f)) refuse(f);
#endif
}

}  // namespace
