// A node's loop thread doing long work at a round boundary (its checkpoint
// written and hashed: at a billion parameters tens of seconds on one disk)
// neither reads nor sends meanwhile, and its peers, hearing nothing for a
// heartbeat timeout, would take it for lost: its children reconnect (to
// the root's standby, which may take over), its parent drops it and
// sends it the model in full. So the node opens a KeepAlive around such
// work, and the work calls KeepAlive::pulse() between its pieces (each
// MiB written, each 16 MiB hashed): from there the node's `beat` runs
// once per period, on the same thread, and sends its heartbeats marked
// busy (wire::kFlagBusy). The work's own layers (common/atomic_file,
// common/sha256) know nothing of nodes: the scope is per thread.
//
// Thread safety: a KeepAlive belongs to the thread that made it and beats
// only there; pulse() on a thread without one does nothing. Scopes nest:
// the innermost beats. A beat's exception is logged and dropped (what the
// work does must not fail for a heartbeat that did not go), and a beat
// never runs within itself (it may write, and so pulse).
//
// Work that is one blocking call (an fsync of a file written through the
// cache: seconds where the disk is slow) has no pieces to pulse between:
// KeepAlive::during() runs it on a helper thread while this one goes on
// pulsing.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>

namespace fedwan {

class KeepAlive {
 public:
  using Clock = std::chrono::steady_clock;

  // Opens the scope on this thread; the first beat is due a period from now.
  // Past `limit` from now the scope beats no more (once, it says so in the
  // log): a node may be busy for a while, not for ever. Work that hangs (an
  // fsync on a dead disk) then reads as silence, and its peers go on
  // without it (a child to its parent's standby, say).
  KeepAlive(Clock::duration period, std::function<void()> beat,
            Clock::duration limit = Clock::duration::max());
  ~KeepAlive();  // the scope it opened within, if any, is the innermost again
  KeepAlive(const KeepAlive&) = delete;
  KeepAlive& operator=(const KeepAlive&) = delete;

  // Runs this thread's innermost scope's beat when a period passed since
  // its last (or since it opened). Cheap when none is due: a clock read.
  static void pulse();
  // Runs `call` (one blocking system call, say an fsync) and returns what
  // it returned. On a thread with a scope it runs on a helper thread while
  // this one pulses, a few times a period, until it returned; elsewhere it
  // runs here. What it throws is thrown here.
  static int during(const std::function<int()>& call);
  // memcpy in pieces of 16 MiB, pulsing between them: a whole model copied
  // into a file-backed array (the kernel may throttle a writer whose dirty
  // pages pass its limit) takes seconds at a billion parameters.
  static void copy(void* dst, const void* src, size_t bytes);
  // Beats this scope ran so far.
  unsigned long beats() const { return beats_; }

 private:
  void maybe_beat(Clock::time_point now);

  Clock::duration period_;
  std::function<void()> beat_;
  Clock::time_point opened_;
  Clock::duration limit_;
  bool gave_up_ = false;
  Clock::time_point due_;
  KeepAlive* outer_;
  bool beating_ = false;
  unsigned long beats_ = 0;
};

}  // namespace fedwan
