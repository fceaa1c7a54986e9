// SiteCore, the steps of sync(): begin the update, stream it chunk by chunk
// (encoded with error feedback, sealed on the pipeline's worker when the
// link is sealed), say it went, await the next anchor as its chunks come,
// and take it as the new round. Join, service and the receiving side are in
// site_core.cpp, the link's upkeep in site_link.cpp.
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "codec/compact_feedback.hpp"
#include "common/byte_pool.hpp"
#include "common/crash_point.hpp"
#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "node/node_frames.hpp"
#include "security/sealing_pipeline.hpp"
#include "site/site_impl.hpp"

namespace fedwan {

void SiteCore::Impl::run_sync(SyncResult* res) {
  const uint64_t start_round = round;
  const auto current = [&] { return round == start_round && !res->resynced; };
  begin_update();
  send_update(start_round, res);
  if (current()) update_sent();
  await_anchor(start_round, res);
  if (current() && incoming.next_pending() && !finished) take_anchor();
  // Resynced mid-round: the chunks of the next anchor the parent sent
  // after the model in full (model_in_full forgot the older ones) are the
  // new round's, kept for its sync (they wait for its deltas as early
  // chunks); otherwise nothing of the next anchor outlives this sync.
  if (!res->resynced) incoming.forget_next();
  if (finished) confirm_end(res);
  {
    const KeepAlive keep = keep_alive();  // the audit log's fsync: a slow disk's flush
    security->audit_sync();
  }
  res->round = round;
  res->finished = finished;
}

void SiteCore::Impl::begin_update() {
  if (cfg.codec->id() != CodecId::kFp32 && !opt.update_encoder && residual.empty()) {
    residual.assign(plan.total(), 0);  // bf16 zeros
  }
  // Anchor chunk i may arrive while later deltas still go out; it goes into
  // params once delta chunk i is computed (apply_early).
  incoming.expect_next(round + 1);
  outgoing.encoded_upto = 0;
  outgoing.frames.clear();
  outgoing.store.rotate();  // last round's file goes with its frames
  outgoing.sent = false;
  outgoing.digest = Sha256();
  outgoing.bytes = 0;
  outgoing.began = Clock::now();
  uplink->resend().begin(round, outgoing.began);
}

void SiteCore::Impl::send_update(uint64_t start_round, SyncResult* res) {
  const bool lossy = cfg.codec->id() != CodecId::kFp32;
  std::vector<float> delta(plan.chunk_elements());
  // On a secure link, chunk i is encrypted on a worker while chunk i+1 is
  // encoded here, so sealing costs no extra time while the encoder is busy.
  if (welcome.link_ok && !welcome.awaiting) {
    try {
      link().wait_established(cfg.heartbeat_timeout);
    } catch (const TimeoutError&) {
      welcome.link_ok = false;
    }
  }
  security::FrameSealer* sealer =
      welcome.link_ok && link().established() ? link().security().sealer() : nullptr;
  std::optional<security::SealingPipeline> sealing;
  if (sealer != nullptr) {
    sealing.emplace(*sealer, 2);
    sealing_active = true;
  }
  struct SealingFlag {
    bool& active;
    ~SealingFlag() { active = false; }
  } sealing_flag{sealing_active};
  if (local_privacy) begin_private_update();
  for (uint32_t i = 0; i < plan.count() && round == start_round && !res->resynced; ++i) {
    await_pace(start_round, i, sealing, res);
    if (round != start_round || res->resynced) break;
    const uint64_t off = plan.offset(i);
    const uint32_t n = plan.size(i);
    // Encoded into the frame itself, which is kept for resends as it is and
    // sealed across into the bytes that go.
    const wire::FrameHeader h = node::chunk_header(topo, self.index, wire::MsgType::kDelta, round,
                                                   plan, i, cfg.codec->id(), self.weight);
    const size_t bytes = cfg.codec->encoded_size(n);
    auto frame = BytePool::shared().take_shared(wire::kHeaderSize + bytes);
    wire::frame_to_fill(h, bytes, *frame);
    uint8_t* payload = frame->data() + wire::kHeaderSize;
    if (opt.update_encoder) {
      opt.update_encoder->encode(*cfg.codec, off, n, lossy, payload);
    } else if (lossy && !local_privacy) {
      // The difference made a block at a time as it is encoded.
      codec::encode_difference_with_bf16_residual(*cfg.codec, anchor.data() + off, work + off, n,
                                                  residual.data() + off, residual_scratch, delta,
                                                  payload);
    } else {
      for (uint32_t k = 0; k < n; ++k) delta[k] = anchor[off + k] - work[off + k];
      if (local_privacy) local_privacy->apply(delta.data(), n);
      if (lossy) {
        codec::encode_with_bf16_residual(*cfg.codec, delta.data(), n, residual.data() + off,
                                         residual_scratch, payload);
      } else {
        cfg.codec->encode(delta.data(), n, nullptr, payload);
      }
    }
    outgoing.encoded_upto = i + 1;
    if (security->auditing()) outgoing.digest.update(payload, bytes);  // only the audit reads it
    outgoing.bytes += bytes;
    outgoing.frames.push_back(outgoing.store.keep(node::Frame(frame)));
    if (sealing && welcome.link_ok) {
      sealing->submit(node::Frame(std::move(frame)));
      send_sealed(*sealing, 1, res);
    } else {
      send_now(*frame, res);
    }
    if (i == 0) crash_point("site.mid_upload");
    apply_early();
    pump(Millis(0), res);
    throw_if_stopped("while sending its update");
  }
  if (sealing) send_sealed(*sealing, 0, res);
  incoming.progressed(Clock::now());
}

// Local differential privacy: the round's update is clipped and noised once,
// chunk by chunk as it is encoded; the audit log holds one release a round
// (a site restarted mid-round releases that round again: docs/security.md).
void SiteCore::Impl::begin_private_update() {
  local_privacy->begin(anchor.data(), work, plan.total());
  security->audit("privacy_release", {{"round", round},
                                      {"mode", "local"},
                                      {"clipped", local_privacy->scale() < 1},
                                      {"clip", cfg.privacy.clip},
                                      {"noise_multiplier", cfg.privacy.noise_multiplier},
                                      {"noise_std", local_privacy->noise_std()}});
}

void SiteCore::Impl::send_sealed(security::SealingPipeline& sealing, size_t keep, SyncResult* res) {
  std::vector<uint8_t> sealed;
  while (sealing.in_flight() > keep) {
    if (!sealing.next(&sealed, cfg.round_timeout)) {
      throw TimeoutError("site '" + self.id + "': sealing a delta chunk timed out");
    }
    if (!welcome.link_ok) continue;
    try {
      res->bytes_sent += link().send_sealed(std::move(sealed), cfg.heartbeat_timeout);
    } catch (const TimeoutError&) {
      welcome.link_ok = false;
    } catch (const TransportError&) {
      welcome.link_ok = false;
    }
  }
}

void SiteCore::Impl::await_pace(uint64_t start_round, uint32_t chunk,
                                std::optional<security::SealingPipeline>& sealing,
                                SyncResult* res) {
  // Over a long link an idle link costs more than chunks the parent keeps
  // on disk: it does not wait there.
  if (!held_back(start_round, chunk) || !welcome.link_ok || link().long_link()) return;
  if (sealing) {
    send_sealed(*sealing, 0, res);  // what was encoded goes first
    sealing.reset();
    sealing_active = false;
  }
  auto heard_at = Clock::now();
  uint64_t heard = pace.heard;
  while (held_back(start_round, chunk) && round == start_round && !res->resynced && !finished) {
    const auto now = Clock::now();
    if (pace.heard != heard) {
      heard = pace.heard;
      heard_at = now;
    }
    // A parent that stopped telling (a lost frame, a parent gone) holds
    // nothing back for longer than it takes to judge it silent.
    if (now - heard_at > cfg.heartbeat_timeout) {
      log().warn("[site:{}] the parent allowed no more than {} chunks of round {} and said "
                 "nothing for {} ms; sending the rest of the update unpaced",
                 self.id, pace.allowed, start_round, cfg.heartbeat_timeout.count());
      pace.unpaced_round = start_round;
      pace.window = 0;  // later rounds too, until it paces again
      break;
    }
    // A parent that goes on holding it back (another child never delivers)
    // fails the sync as a round that never closes does, never hangs it.
    if (now - outgoing.began > cfg.round_timeout) {
      throw TimeoutError("site '" + self.id + "': its parent held back chunk " +
                         std::to_string(chunk) + " of " + std::to_string(plan.count()) +
                         " of the update for round " + std::to_string(start_round) + " (allowed " +
                         std::to_string(pace.allowed) + ") for over " +
                         std::to_string(cfg.round_timeout.count()) +
                         " ms (round_timeout): it waits for another child's update");
    }
    throw_if_stopped("while its parent paces its update");
    pump(Millis(10), res);
  }
  security::FrameSealer* sealer =
      welcome.link_ok && link().established() ? link().security().sealer() : nullptr;
  if (sealer != nullptr) {
    sealing.emplace(*sealer, 2);
    sealing_active = true;
  }
}

void SiteCore::Impl::update_sent() {
  outgoing.sent = true;
  outgoing.sent_at = Clock::now();
  uplink->resend().handed_over(outgoing.sent_at);
  if (security->auditing()) {
    const Sha256Digest d = outgoing.digest.finish();
    security->audit("update_sent", {{"round", round},
                                    {"parent", topo.node(self.parent_index).id},
                                    {"chunks", plan.count()},
                                    {"bytes", outgoing.bytes},
                                    {"sha256", to_hex(d.data(), d.size())}});
  }
  if (!welcome.link_ok)
    welcome.hello_pending = welcome.awaiting = true;  // resent after the welcome
}

void SiteCore::Impl::await_anchor(uint64_t start_round, SyncResult* res) {
  const auto deadline = Clock::now() + cfg.round_timeout;
  while (round == start_round && !finished && !res->resynced) {
    if (incoming.next_complete()) break;
    if (Clock::now() >= deadline) {
      throw TimeoutError(
          "site '" + self.id + "': no anchor for round " + std::to_string(round + 1) +
          " from parent '" + topo.node(self.parent_index).id + "' at " + link().endpoint() +
          " within " + std::to_string(cfg.round_timeout.count() / 1000) + " s (" +
          std::to_string(incoming.next_received()) + " of " + std::to_string(plan.count()) +
          " chunks in; is it running?)" +
          (welcome.last_link_error.empty() ? "" : " Last link error: " + welcome.last_link_error));
    }
    throw_if_stopped("while waiting for the next anchor");
    pump(Millis(50), res);
  }
}

void SiteCore::Impl::take_anchor() {
  // The kept chunks applied and the checkpoint written: its parent goes on
  // hearing from it.
  const KeepAlive keep = keep_alive();
  apply_early();  // every chunk is now in the anchor (and, not overlapped, in params)
  anchor_mixed = false;
  round += 1;
  outgoing.sent = false;
  outgoing.frames.clear();
  if (round >= cfg.rounds) finished = true;
  round_checkpoint(/*upload=*/!finished, /*on_anchor=*/true);
  anchor.cool();  // next read by the next update
}

// Sending one frame, and the update's frames again.

bool SiteCore::Impl::send_now(std::vector<uint8_t> frame, SyncResult* res) {
  if (!welcome.link_ok) return false;
  try {
    res->bytes_sent += link().send(std::move(frame), cfg.heartbeat_timeout);
    return true;
  } catch (const TimeoutError& e) {
    log().warn("[site:{}] send to the parent failed: {}", self.id, e.what());
  } catch (const TransportError& e) {
    log().warn("[site:{}] send to the parent failed: {}", self.id, e.what());
  }
  welcome.link_ok = false;
  return false;
}

void SiteCore::Impl::resend_update() {
  if (sealing_active) return;  // mid-upload: the update is going out anyway
  SyncResult ignored;
  for (const node::StoredFrame& fr : outgoing.frames) {
    if (!send_now(*fr.load(), &ignored)) return;
  }
}

void SiteCore::Impl::resend_chunks(const std::vector<uint32_t>& chunks, SyncResult* res) {
  if (sealing_active) return;  // mid-upload: the update is going out anyway
  for (uint32_t c : chunks) {
    if (c >= outgoing.frames.size()) continue;
    const uint64_t before = res->bytes_sent;
    if (!send_now(*outgoing.frames[c].load(), res)) return;
    res->bytes_resent += res->bytes_sent - before;
  }
}

}  // namespace fedwan
