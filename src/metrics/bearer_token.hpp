// The bearer token that guards a metrics endpoint (docs/security.md,
// "Membership, metrics and cost records"): read from a file at start, sent
// by scrapers as `Authorization: Bearer <token>`, compared in constant time.
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace fedwan::metrics {

// Shortest token accepted: a guessable one protects nothing.
inline constexpr size_t kMinBearerTokenBytes = 16;

// The token in `path`: its text without surrounding whitespace (a trailing
// newline is usual). Throws ConfigError when the file cannot be read, is
// readable or writable by others than its owner and group (chmod o-rwx; a
// Kubernetes Secret volume with defaultMode 0400 or 0440 is fine), or holds
// a token shorter than kMinBearerTokenBytes or with characters outside
// printable ASCII or with whitespace inside.
std::string read_bearer_token_file(const std::string& path);

// Whether an Authorization header's value is "Bearer <token>" (the scheme in
// any case). The comparison takes the same time wherever the values differ.
bool bearer_token_matches(std::string_view authorization, const std::string& token);

}  // namespace fedwan::metrics
