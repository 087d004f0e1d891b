// A dead peer on the same host, noticed by its process. Over libfabric's shm nothing tells a
// process that its peer died: no connection breaks, a write into its memory still completes
// (it lands in the shared region), and the only sign is silence, which the dead-peer check
// turns into an error after TSNET_TIMEOUT_SEC (10 s by default) with requests pending. NCCL's
// Socket transport and tsnet over TCP see the closed socket at once. So where every peer is on
// this host (shm), CONNECT and ACCEPT carry each side's process id and start time, and a comm
// whose peer has been quiet for PROBE_MS with requests pending looks the process up in /proc:
// gone, a zombie, or the pid now taken by a process that started later, and the comm fails.
//
// The pid is checked only where it means the same process on both sides: at connect time,
// while the peer is alive, /proc/<pid>/stat of its pid must show the start time it sent.
// Another pid namespace (containers that share /dev/shm), a /proc mounted with hidepid, or a
// peer that sent no start time leave the comm to the silence check, with an INFO line.
import * as fs from 'node:fs';

/** What /proc/<pid>/stat says: the state letter and the start time (clock ticks after boot). */
export interface ProcInfo {
  state: string;
  start: number;
}

/** Reads a process's ProcInfo; null when no such process is visible. */
export type ProcStat = (pid: number) => ProcInfo | null;

/** A comm probes its quiet peer's process at most this often (ms), from the watchdog's tick. */
export const PROBE_MS = 250;

/** /proc/<pid>/stat: fields after the command name (which may hold spaces and parentheses). */
export function parseProcStat(text: string): ProcInfo | null {
  const close = text.lastIndexOf(')');
  if (close < 0) return null;
  const f = text.slice(close + 2).split(' ');
  // f[0] is field 3 (state); the start time is field 22.
  const start = Number(f[19]);
  if (!f[0] || !Number.isSafeInteger(start) || start <= 0) return null;
  return { state: f[0], start };
}

export const readProcStat: ProcStat = (pid) => {
  if (!Number.isInteger(pid) || pid <= 0) return null;
  try {
    return parseProcStat(fs.readFileSync(`/proc/${pid}/stat`, 'latin1'));
  } catch {
    return null;
  }
};

/** The peer processes of one endpoint whose peers all run on this host. */
export class PeerProcesses {
  /** This process's start time, sent in CONNECT and ACCEPT (0: unknown). */
  readonly selfStart: number;
  /** Why the first peer that could not be watched could not (its INFO line is written once). */
  unwatched = '';

  constructor(
    readonly stat: ProcStat,
    selfPid: number,
    selfStart?: number,
  ) {
    this.selfStart = selfStart ?? stat(selfPid)?.start ?? 0;
  }

  /** Whether the peer that sent (pid, start) can be watched here; else why not. */
  check(pid: number, start: number): true | string {
    if (pid === 0 || start === 0) return 'the peer sent no process id or start time';
    const p = this.stat(pid);
    if (!p) return `process ${pid} is not visible here (another pid namespace, or /proc hides it)`;
    if (p.start !== start) return `process ${pid} here started at ${p.start}, the peer's at ${start} (another pid namespace)`;
    return true;
  }

  /** How the watched peer (pid, start) is gone; null while it lives. */
  gone(pid: number, start: number): string | null {
    const p = this.stat(pid);
    if (!p) return `process ${pid} has exited`;
    if (p.start !== start) return `process ${pid} has exited (its pid now names a later process)`;
    if (p.state === 'Z' || p.state === 'X') return `process ${pid} has exited (state ${p.state})`;
    return null;
  }
}
