// A file without a name for what a node keeps only while it runs (spill
// files, a mapped anchor): gone with its last descriptor or mapping, whatever
// the process's end. O_TMPFILE where the file system has it, else a named
// file unlinked at once.
#pragma once

#include <filesystem>
#include <string>

namespace fedwan {

// Opened read-write in `dir` (made if missing; the temporary directory when
// empty): its descriptor, or -1 with errno set. *where names the directory
// used, for messages.
int open_unnamed_file(const std::filesystem::path& dir, std::string* where);

}  // namespace fedwan
