// TSNET_STATS=1: what each comm and each protocol thread did, logged at INFO when a comm
// closes and when a context is finalized. Costs nothing when off (counters only).
import type { CommStats } from './protocol/endpoint';

export interface ThreadStats {
  /** Requests NCCL posted to this thread. */
  requests: number;
  /** Thread CPU (µs) when the counting began. */
  cpuStart: number;
  /** Busy time (µs: turns and control calls) when the counting began. */
  busyStart: number;
  started: number;
}

const gb = (bytes: number) => (bytes / 1e9).toFixed(3);

export function commStatsLine(id: number, kind: string, s: CommStats, ms: number): string {
  return `stats: comm ${id} (${kind}): ${s.messages} messages, ${gb(s.bytes)} GB in ${(ms / 1000).toFixed(2)} s`;
}

/**
 * CPU counts the busy-poll window too (TSNET_SPIN_US); busy is the time spent in turns and
 * control calls: what a request really costs the thread.
 */
export function threadStatsLine(thread: number, s: ThreadStats, cpuNow: number, busyNow: number): string {
  const cpu = cpuNow - s.cpuStart;
  const busy = busyNow - s.busyStart;
  const per = (us: number) => (s.requests ? (us / s.requests).toFixed(2) : '-');
  return (
    `stats: protocol thread ${thread}: ${s.requests} requests in ${((Date.now() - s.started) / 1000).toFixed(2)} s; ` +
    `CPU ${(cpu / 1e6).toFixed(3)} s (${per(cpu)} us per request), busy ${(busy / 1e6).toFixed(3)} s (${per(busy)} us per request)`
  );
}
