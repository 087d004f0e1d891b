// WakeDelays (wake_delays.h) as JavaScript sees it: { count, sumUs, maxUs, buckets }.
#pragma once
#include <napi.h>

#include "wake_delays.h"

namespace tsn {

inline Napi::Object wakeDelaysObject(Napi::Env env, const WakeDelays& w) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("count", static_cast<double>(w.count.load(std::memory_order_relaxed)));
  o.Set("sumUs", static_cast<double>(w.sumNs.load(std::memory_order_relaxed)) / 1e3);
  o.Set("maxUs", static_cast<double>(w.maxNs.load(std::memory_order_relaxed)) / 1e3);
  Napi::Array b = Napi::Array::New(env, WakeDelays::kBuckets);
  for (int k = 0; k < WakeDelays::kBuckets; k++) b.Set(k, static_cast<double>(w.buckets[k].load(std::memory_order_relaxed)));
  o.Set("buckets", b);
  return o;
}

}  // namespace tsn
