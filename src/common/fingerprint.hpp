// A fingerprint that tells equal byte strings from different ones, several
// times faster than SHA-256: XXH3 (libxxhash) under a 192-byte secret drawn
// at random once per process, which never leaves it (about 11 GB/s on one
// core of the benchmark machine against SHA-256's 1.8 and the GMAC it
// replaced, 7; docs/benchmarks.md). It is not a cryptographic hash: it
// serves where equal strings are to be found among one party's own (the
// replay check compares a child's copies with that child's earlier ones),
// where a collision someone contrived would only make that party's own
// copy look like a replay. Two different strings agree by chance with
// probability about 2^-64. It is not a commitment: a fingerprint means
// nothing to another process, or to this one after a restart. Where a
// digest must be shown to someone (an audit entry, a checkpoint) or must
// resist a forger, SHA-256 (common/sha256.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fedwan {

// Thread safe. Throws CryptoError when OpenSSL cannot draw the secret
// (on first use).
uint64_t fingerprint64(const void* data, size_t n);

}  // namespace fedwan
