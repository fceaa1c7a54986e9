// What the CPU this process runs on can do, asked once. The kernels with a
// vector path (codecs, accumulation, the norm screen, the outer optimizer)
// pick it by these; every other CPU takes their scalar path, which gives the
// same bits.
#pragma once

namespace fedwan {

// AVX2, with the OS saving the YMM registers. False off x86-64.
bool cpu_has_avx2();
// AVX2 and F16C (fp32 <-> fp16 conversion). False off x86-64.
bool cpu_has_avx2_f16c();

}  // namespace fedwan
