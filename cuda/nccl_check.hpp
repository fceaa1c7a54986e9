// The one checking wrapper for NCCL calls: a failed call throws a fedwan
// exception with the call's text, NCCL's name for the result, NCCL's last
// error message and file:line. Misuse that a user can fix (a bad argument,
// two ranks on one GPU) is a ConfigError; everything else (a peer gone, a
// network or CUDA failure) a TransportError. Header-only; include it only
// where FEDWAN_HAVE_NCCL is defined.
#pragma once

#include <nccl.h>

#include <string>

#include "fedwan/error.hpp"

namespace fedwan::cuda::detail {

inline std::string nccl_error_text(ncclResult_t status) {
  std::string text = std::string(ncclGetErrorString(status)) + " (ncclResult " +
                     std::to_string(static_cast<int>(status)) + ")";
  // The comm argument is unused by NCCL here: the message is per thread.
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') text += ": " + std::string(last);
  return text;
}

[[noreturn]] inline void throw_nccl(ncclResult_t status, const char* call, const char* file,
                                    int line) {
  const std::string what = std::string(file) + ":" + std::to_string(line) + ": " + call +
                           " failed: " + nccl_error_text(status);
  if (status == ncclInvalidArgument || status == ncclInvalidUsage) {
    throw ConfigError(what + " (check the ranks, devices and buffers given to the site "
                             "communicator; set NCCL_DEBUG=WARN for NCCL's own account)");
  }
  throw TransportError(what + " (set NCCL_DEBUG=WARN for NCCL's own account)");
}

// Returns `status` when it is ncclSuccess, or ncclInProgress where the
// caller polls a non-blocking communicator; throws otherwise.
inline ncclResult_t check_nccl(ncclResult_t status, bool in_progress_ok, const char* call,
                               const char* file, int line) {
  if (status == ncclSuccess || (in_progress_ok && status == ncclInProgress)) return status;
  throw_nccl(status, call, file, line);
}

}  // namespace fedwan::cuda::detail

// FEDWAN_NCCL_CHECK(ncclGetUniqueId(&id));  throws unless ncclSuccess.
#define FEDWAN_NCCL_CHECK(call) \
  ::fedwan::cuda::detail::check_nccl((call), false, #call, __FILE__, __LINE__)

// For calls on a non-blocking communicator: ncclInProgress is returned, not
// thrown (poll ncclCommGetAsyncError until it changes).
#define FEDWAN_NCCL_CHECK_ASYNC(call) \
  ::fedwan::cuda::detail::check_nccl((call), true, #call, __FILE__, __LINE__)
