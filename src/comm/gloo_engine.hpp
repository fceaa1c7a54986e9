// Which Gloo the site communicator's CPU engine runs on.
//
// One copy of Gloo per process: with Debian's LibTorch (which links the
// system's libgloo) fedwan_core runs Gloo itself (comm/gloo_comm.cpp). A
// LibTorch that carries its own Gloo (the pip `torch` wheel) defines Gloo's
// symbols too, so fedwan_core is built without Gloo and the torch layer
// installs an engine over that LibTorch's Gloo, through c10d
// (torch/c10d_gloo_comm.cpp), when libfedwan is loaded.
#pragma once

#include <exception>
#include <memory>
#include <string>

#include "fedwan/error.hpp"
#include "fedwan/site_comm.hpp"

namespace fedwan::comm {

// Everything declared here is exported (FEDWAN_API) for libfedwan, whose
// engine over LibTorch's own Gloo (torch/c10d_gloo_comm.cpp) installs itself
// and shares these checks; none of it is public API.

using GlooEngine = std::unique_ptr<SiteComm> (*)(const SiteCommOptions&);

// make_gloo_comm() builds its communicators with `engine` from now on.
FEDWAN_API void install_gloo_engine(GlooEngine engine);

// Throws ConfigError for options no engine can run (rank outside the site,
// no rendezvous directory, a timeout <= 0); creates the rendezvous
// directory.
FEDWAN_API void prepare_site_comm(const SiteCommOptions& options);

// The TransportError text of a failed collective, the same for every engine
// (`cause` up to its first line: c10d appends a backtrace).
FEDWAN_API std::string comm_failure(const SiteCommOptions& options, const char* what,
                                    const char* cause);

// Throws ConfigError unless `root` is a rank of the site.
FEDWAN_API void check_root(const SiteCommOptions& options, int root);

// Runs one engine call: refused once `broken`; any failure sets `broken`
// (the communicator stays unusable) and becomes a TransportError.
template <class F>
void guarded(const SiteCommOptions& options, bool& broken, const char* what, F&& call) {
  if (broken) {
    throw TransportError("site communicator '" + options.name + "' (rank " +
                         std::to_string(options.rank) + ") failed earlier; restart the site");
  }
  try {
    call();
  } catch (const std::exception& e) {
    broken = true;
    throw TransportError(comm_failure(options, what, e.what()));
  }
}

}  // namespace fedwan::comm
