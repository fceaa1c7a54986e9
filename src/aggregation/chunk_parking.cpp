#include "aggregation/chunk_parking.hpp"

#include <cerrno>
#include <utility>

#include "common/errno_text.hpp"
#include "common/log.hpp"

namespace fedwan::aggregation {

void ChunkParking::enable(size_t budget, std::filesystem::path dir, std::string log_name) {
  on_ = true;
  budget_ = budget;
  dir_ = std::move(dir);
  log_name_ = std::move(log_name);
}

bool ChunkParking::write(const void* data, size_t size, Ticket* ticket) {
  if (!on_ || failed_ || size == 0) return false;
  std::string why;
  if (!file_) file_ = files_.next(dir_, &why);
  uint64_t offset = 0;
  if (file_ && file_->append(data, size, &offset)) {
    *ticket = {file_, offset, size};
    parked_ += 1;
    bytes_parked_ += size;
    round_parked_ += 1;
    round_bytes_ += size;
    return true;
  }
  if (file_) why = errno_text(errno);
  failed_ = true;
  file_.reset();
  if (!warned_) {
    log().warn("[{}] cannot set chunks in flight aside on disk ({}); they stay in memory this "
               "round",
               log_name_, why);
  }
  warned_ = true;
  return false;
}

bool ChunkParking::park(std::vector<float>* state, Ticket* ticket, std::vector<float>* freed) {
  if (!write(state->data(), state->size() * sizeof(float), ticket)) return false;
  if (freed != nullptr) {
    *freed = std::move(*state);
    state->clear();
    state->shrink_to_fit();
  } else {
    std::vector<float>().swap(*state);
  }
  return true;
}

void ChunkParking::unpark(std::vector<float>* state, Ticket* ticket) {
  state->resize(ticket->bytes / sizeof(float));
  ticket->file->read(ticket->offset, state->data(), ticket->bytes);
  *ticket = {};
}

bool ChunkParking::park_bytes(const void* data, size_t size, Ticket* ticket) {
  return write(data, size, ticket);
}

void ChunkParking::unpark_bytes(std::vector<uint8_t>* out, Ticket* ticket) {
  out->resize(ticket->bytes);
  ticket->file->read(ticket->offset, out->data(), ticket->bytes);
  *ticket = {};
}

void ChunkParking::rotate() {
  if (round_parked_ > 0) {
    log().debug("[{}] {} chunk states waited on disk for their last copies last round ({:.1f} "
                "MiB)",
                log_name_, round_parked_, double(round_bytes_) / (1 << 20));
  }
  round_parked_ = 0;
  round_bytes_ = 0;
  files_.retire(std::move(file_));
  file_.reset();
  failed_ = false;
}

}  // namespace fedwan::aggregation
