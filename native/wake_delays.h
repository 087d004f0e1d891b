// How late sleeping threads wake: from the moment another thread asks one to wake (just before
// it writes the sleeper's eventfd) to the moment the sleeper takes the wake-up. I/O threads and
// protocol threads each keep one, and TSNET_STATS reports them: a host whose threads wake late
// (a VM that parks idle vCPUs, say) shows it here, where a trace would change the timing.
#pragma once
#include <atomic>
#include <cstdint>

namespace tsn {

uint64_t nowNs();  // CLOCK_MONOTONIC (native/engine/engine.cc)

struct WakeDelays {
  // Bucket k counts delays below 2^(k+1) us (bucket 0: below 2 us); the last one, the rest.
  static constexpr int kBuckets = 16;
  std::atomic<uint64_t> askedNs{0};  // the first ask of the current sleep, 0: none pending
  // Written by the woken thread only; read by anyone (relaxed: figures for a report).
  std::atomic<uint64_t> count{0}, sumNs{0}, maxNs{0};
  std::atomic<uint64_t> buckets[kBuckets] = {};

  // The waker, before it writes the eventfd: a second ask before the wake-up keeps the first.
  void asked() {
    uint64_t none = 0;
    askedNs.compare_exchange_strong(none, nowNs(), std::memory_order_relaxed);
  }

  // The woken thread, when it reads its eventfd.
  void woke() {
    uint64_t a = askedNs.exchange(0, std::memory_order_relaxed);
    if (!a) return;
    uint64_t now = nowNs();
    uint64_t d = now > a ? now - a : 0;
    count.fetch_add(1, std::memory_order_relaxed);
    sumNs.fetch_add(d, std::memory_order_relaxed);
    if (d > maxNs.load(std::memory_order_relaxed)) maxNs.store(d, std::memory_order_relaxed);
    int k = 0;
    for (uint64_t us = d / 1000; us >= 2 && k < kBuckets - 1; us >>= 1) k++;
    buckets[k].fetch_add(1, std::memory_order_relaxed);
  }
};

}  // namespace tsn
