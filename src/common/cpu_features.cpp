#include "common/cpu_features.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace fedwan {

bool cpu_has_avx2() {
#if defined(__x86_64__)
  // Safe before static constructors have run: a kernel may be picked while
  // another translation unit is being initialised.
  static const bool supported = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return supported;
#else
  return false;
#endif
}

bool cpu_has_avx2_f16c() {
#if defined(__x86_64__)
  static const bool supported = [] {
    // F16C through CPUID: clang 14's __builtin_cpu_supports does not know
    // "f16c".
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    return cpu_has_avx2() && f16c;
  }();
  return supported;
#else
  return false;
#endif
}

}  // namespace fedwan
