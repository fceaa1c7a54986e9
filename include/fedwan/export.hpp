// Symbol visibility. fedwan's libraries are compiled with hidden visibility:
// only what is marked FEDWAN_API is exported from libfedwan_core,
// libfedwan and libfedwan_cuda. That is the public API of include/fedwan/,
// plus the few internal functions one fedwan library calls in another (each
// marked where it is declared, under src/, and not part of the API).
// FEDWAN_LOCAL keeps a class hidden that would otherwise take the visibility
// of the public class it is nested in (SiteCore::Impl, Aggregator::Impl).
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define FEDWAN_API __attribute__((visibility("default")))
#define FEDWAN_LOCAL __attribute__((visibility("hidden")))
#else
#define FEDWAN_API
#define FEDWAN_LOCAL
#endif
