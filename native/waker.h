// Waking the plugin thread from other threads. libuv 1.44's uv_async_send makes the loop
// thread busy-wait while a sender is between flagging and writing its eventfd, which costs
// the plugin thread dearly when senders get preempted (measured: 15% of its time). A Waker is
// an eventfd watched by a uv_poll_t, with a flag so that a burst of wake() calls writes once.
#pragma once
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <uv.h>

#include <atomic>
#include <cstdint>

#include "wake_delays.h"

namespace tsn {

class Waker {
 public:
  using Callback = void (*)();

  // Plugin thread. Returns false when no eventfd could be made.
  bool init(uv_loop_t* loop, Callback cb) {
    cb_ = cb;
    fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd_ < 0) return false;
    poll_.data = this;
    uv_poll_init(loop, &poll_, fd_);
    uv_poll_start(&poll_, UV_READABLE, [](uv_poll_t* p, int, int) {
      Waker* w = static_cast<Waker*>(p->data);
      uint64_t v;
      ssize_t r = read(w->fd_, &v, sizeof v);
      (void)r;
      w->pending_.store(false, std::memory_order_seq_cst);
      w->delays.woke();
      w->cb_();
    });
    return true;
  }

  // Any thread, after publishing work with seq_cst (or release) stores.
  void wake() {
    if (pending_.exchange(true, std::memory_order_seq_cst)) return;
    delays.asked();
    uint64_t one = 1;
    ssize_t r = write(fd_, &one, sizeof one);
    (void)r;
  }

  WakeDelays delays;  // how late the plugin thread took the wake-ups (TSNET_STATS)

  // For a WARN about a link gone quiet (any thread): a wake-up asked and not yet taken, and
  // whether the eventfd holds one (libuv then calls back at its loop's next turn).
  bool pending() const { return pending_.load(std::memory_order_seq_cst); }
  bool readable() const {
    pollfd p{fd_, POLLIN, 0};
    return fd_ >= 0 && poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
  }

 private:
  int fd_ = -1;
  uv_poll_t poll_;
  std::atomic<bool> pending_{false};
  Callback cb_ = nullptr;
};

}  // namespace tsn
