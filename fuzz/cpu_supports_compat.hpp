// Force-included into src/codec/half.cpp by fuzz/CMakeLists.txt, and only
// when the compiler's __builtin_cpu_supports does not know "f16c" (GCC does,
// clang 14 does not). half.cpp picks its AVX2 + F16C kernels
// with __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"); this
// answers the same question through CPUID so the file compiles unchanged.
#pragma once

#include <cpuid.h>

#include <cstring>

static inline bool fedwan_fuzz_cpu_supports(const char* feature) {
  if (std::strcmp(feature, "f16c") == 0) {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    // F16C operates on YMM registers: the AVX check covers OS support for them.
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
           (ecx & bit_F16C) != 0;
  }
  if (std::strcmp(feature, "avx2") == 0) return __builtin_cpu_supports("avx2");
  if (std::strcmp(feature, "avx") == 0) return __builtin_cpu_supports("avx");
  return false;
}

#define __builtin_cpu_supports(feature) fedwan_fuzz_cpu_supports(feature)
