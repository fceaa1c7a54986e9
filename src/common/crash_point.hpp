// Crash points for recovery testing: a process started with
//   FEDWAN_CRASH_POINT=<name>[@<n>]
// kills itself with SIGKILL the n-th time (default: the first) execution
// reaches crash_point("<name>"). Production runs leave the variable unset and
// pay one cached getenv per call. Names in use (docs/operations.md):
//   checkpoint.written  checkpoint.synced  checkpoint.renamed
//   replica_image.written  replica_image.synced  replica_image.renamed
//   site.mid_upload     site.replica_stored
//   aggregator.update_accepted  aggregator.round_closed
//
// Stall points, for liveness testing: a process started with
//   FEDWAN_STALL_POINT=<name>@<ms>
// sleeps <ms> milliseconds each time execution reaches stall_point("<name>").
// Names in use: checkpoint.block, replica_image.block (each MiB of a
// checkpoint or replica image written: a slow disk); file.sync (each fsync
// of a file written whole and replaced, on the thread that syncs it: a
// slow disk's flush); audit.sync (each fsync of the audit log, likewise).
// Thread safety: safe to call from any thread.
#pragma once

#include <string_view>

namespace fedwan {

void crash_point(std::string_view name);
void stall_point(std::string_view name);

}  // namespace fedwan
