// A dead peer on the same host, noticed by its process. Over libfabric's shm nothing tells a
// process that its peer died: no connection breaks, a write into its memory still completes
// (it lands in the shared region), and the only sign is silence, which the dead-peer check
// turns into an error after TSNET_TIMEOUT_SEC (10 s by default) with requests pending; over
// libfabric's tcp between two processes of one host the same was measured (8.8 s under
// PyTorch). NCCL's Socket transport and tsnet over TCP see the closed socket at once. So
// CONNECT and ACCEPT carry each side's kernel boot id, process id and start time, and where the
// boot ids are equal (the peer runs on this host, whatever the provider) a comm whose peer has
// been quiet for PROBE_MS with requests pending looks the process up in /proc: gone, a zombie,
// or the pid now taken by a process that started later, and the comm fails.
//
// The pid is checked only where it means the same process on both sides: at connect time,
// while the peer is alive, /proc/<pid>/stat of its pid must show the start time it sent.
// Another pid namespace (containers on one host), a /proc mounted with hidepid, or a peer that
// sent no start time leave the comm to the silence check, with an INFO line. A peer on another
// host (another boot id) is left to it silently: that is the usual case of a NIC.
import * as fs from 'node:fs';
import { BOOT_ID_BYTES } from './wire';

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

/** /proc/sys/kernel/random/boot_id as 16 bytes (one per boot of a kernel, shared by its containers); zeros where unreadable. */
export function readBootId(): Uint8Array {
  const out = new Uint8Array(BOOT_ID_BYTES);
  try {
    const hex = fs.readFileSync('/proc/sys/kernel/random/boot_id', 'latin1').trim().replace(/-/g, '');
    if (/^[0-9a-f]{32}$/i.test(hex)) for (let i = 0; i < BOOT_ID_BYTES; i++) out[i] = Number.parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  } catch {
    // no /proc: every peer is left to the silence check
  }
  return out;
}

const known = (boot: Uint8Array) => boot.some((x) => x !== 0);

/** The peer processes of one endpoint: those on this host (the same boot id) are watched. */
export class PeerProcesses {
  /** This process's start time, sent in CONNECT and ACCEPT (0: unknown). */
  readonly selfStart: number;
  /** This kernel's boot id, sent in CONNECT and ACCEPT (zeros: unknown). */
  readonly boot: Uint8Array;
  /** The INFO line about a peer on this host that could not be watched was written (once per endpoint). */
  toldUnwatched = false;

  constructor(
    readonly stat: ProcStat,
    selfPid: number,
    selfStart?: number,
    boot?: Uint8Array,
  ) {
    this.selfStart = selfStart ?? stat(selfPid)?.start ?? 0;
    this.boot = boot ?? readBootId();
  }

  /** Whether the peer that sent boot is on this host. */
  sameHost(boot: Uint8Array): boolean {
    if (!known(this.boot) || !known(boot) || boot.length !== this.boot.length) return false;
    for (let i = 0; i < boot.length; i++) if (boot[i] !== this.boot[i]) return false;
    return true;
  }

  /** Whether the peer on this host that sent (pid, start) can be watched; else why not. */
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
