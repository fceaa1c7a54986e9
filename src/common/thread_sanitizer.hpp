// What ThreadSanitizer cannot see for itself: an object handed from one
// thread to another through a library it does not instrument (ZeroMQ's
// queues between a socket's owner and its I/O thread). The handing thread
// calls handed_over(p) after its last write of the object, the taking
// thread taken_over(p) before its first access: the sanitizer then orders
// the two as a mutex would. Nothing in a build without it.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define FEDWAN_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FEDWAN_TSAN 1
#endif
#endif

#if defined(FEDWAN_TSAN)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace fedwan {

inline void handed_over([[maybe_unused]] void* object) {
#if defined(FEDWAN_TSAN)
  __tsan_release(object);
#endif
}

inline void taken_over([[maybe_unused]] void* object) {
#if defined(FEDWAN_TSAN)
  __tsan_acquire(object);
#endif
}

}  // namespace fedwan
