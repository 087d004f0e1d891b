// Single-producer single-consumer rings over shared memory (records.h), as native threads use
// them. The JavaScript side (plugin/engine/port.ts) follows the same rules with Atomics.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "records.h"

namespace tsn {

inline uint32_t loadAcquire(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline uint32_t loadSeqCst(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
inline void storeRelease(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline void storeSeqCst(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }

template <typename Rec>
struct Ring {
  tsn_ring_hdr_t* hdr = nullptr;
  Rec* recs = nullptr;
  size_t bytes = 0;  // header and records

  // Allocates a ring of capacity records (a power of two), zeroed, cache-line aligned.
  bool init(uint32_t capacity) {
    bytes = sizeof(tsn_ring_hdr_t) + sizeof(Rec) * capacity;
    void* mem = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!mem) return false;
    memset(mem, 0, bytes);
    hdr = static_cast<tsn_ring_hdr_t*>(mem);
    hdr->mask = capacity - 1;
    hdr->recordBytes = sizeof(Rec);
    recs = reinterpret_cast<Rec*>(static_cast<char*>(mem) + sizeof(tsn_ring_hdr_t));
    return true;
  }
  uint32_t capacity() const { return hdr->mask + 1; }
  Rec* at(uint32_t i) const { return &recs[i & hdr->mask]; }
  // Consumer: records waiting from head (its own) to the producer's tail.
  uint32_t ready(uint32_t head) const { return loadAcquire(&hdr->tail) - head; }
  // Producer: room left given its own tail.
  uint32_t room(uint32_t tail) const { return capacity() - (tail - loadAcquire(&hdr->head)); }
};

}  // namespace tsn
