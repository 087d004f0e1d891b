// The plugin's clock for liveness and timeouts: whole milliseconds on a monotonic clock.
//
// Date.now() is the wall clock. A step of it (NTP or chrony stepping the time, a VM resumed, an
// administrator) moved every "last heard" time at once: forward by more than the timeout, it
// failed every comm with a request pending as if its peer were dead; backward, it left a dead
// peer undetected for as long as the step. A monotonic clock does neither.
//
// Inside NCCL the binding gives CLOCK_MONOTONIC in whole milliseconds since the binding was
// loaded (native/engine/engine_js.cc): a whole number below 2^30 is a small integer to V8, so reading it
// allocates nothing, where Date.now() allocated a number per read and Node 18's
// performance.now() an array. Elsewhere (the tests, the benchmark) it is performance.now().
// Times start near 0: a "never" must be -Infinity, not 0.

export type Clock = () => number;

const fallback: Clock = () => Math.floor(performance.now());
let source: Clock = fallback;

/** Milliseconds on the plugin's monotonic clock. */
export function monoMs(): number {
  return source();
}

/** Sets the clock's source (the binding's, or a test's); undefined restores performance.now(). Returns the one before. */
export function setClock(c: Clock | undefined): Clock {
  const old = source;
  source = c ?? fallback;
  return old;
}
