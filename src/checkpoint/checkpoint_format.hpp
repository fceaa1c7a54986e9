// What the checkpoint reader (checkpoint_file.cpp) and writer
// (checkpoint_write.cpp) share of the layout checkpoint_file.hpp describes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string_view>

namespace fedwan::checkpoint_format {

inline constexpr uint8_t kMagic[4] = {'F', 'W', 'C', 'K'};
inline constexpr size_t kDigestSize = 32;

// TransportError "cannot <action> checkpoint <path>: <errno text>".
[[noreturn]] void throw_io(std::string_view action, const std::filesystem::path& path, int err);

}  // namespace fedwan::checkpoint_format
