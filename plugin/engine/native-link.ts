// A stream link whose lanes are sockets owned by native I/O threads (native/engine/): the
// protocol's submissions go into this thread's rings, completions come back through the port.
import { log } from '../log';
import type { LinkEvents, RxRing, StreamLink } from '../protocol/link';
import type { SchedulePolicy } from '../protocol/policies';
import type { CqeHandler, EngineBinding, Port } from './port';
import { RX, STATUS_OK, SUB_F_NOCQE, SubKind } from './records';
import { monoMs } from '../clock';

/** The binding's lane functions (native/engine/engine_js.cc). */
export interface LaneBinding extends EngineBinding {
  ioAdopt(fd: number, thread: number, link: number, rxBytes: number): { lane: number; thread: number; rx?: ArrayBuffer };
  ioClose(lane: number, graceful: boolean): { partial: boolean; hard: boolean };
  ioCancel(lane: number, base: number, len: number): { reads: number; writes: number };
  ioLaneState(lane: number): LaneState;
}

/** What the engine knows of a lane (ioLaneState, native/engine/engine_js.cc); for a WARN. */
export interface LaneState {
  lane: number;
  thread: number;
  /** The I/O thread's sleeping flag: 1 asleep and to be woken, 0 awake (anything else: corrupt). */
  sleepFlag: number;
  /** Wake-ups written to its eventfd and not yet read (-1: unknown). */
  wakeCount: number;
  passes: number;
  inCall: boolean;
  subsWaiting?: number;
  cqesWaiting?: number;
  /** The protocol thread's wake-up: its busy-poll window open, a wake-up asked and not taken, its eventfd readable (absent without a plugin on it). */
  ptSpinning?: boolean;
  ptWakePending?: boolean;
  ptWakeReadable?: boolean;
  listed: boolean;
  hup: boolean;
  locked: boolean;
  closed?: boolean;
  closing?: boolean;
  err?: number;
  eof?: boolean;
  writes?: number;
  writeBytes?: number;
  reads?: number;
  readBytes?: number;
  rxWritten?: number;
  rxConsumed?: number;
  rxCapacity?: number;
  rxStalled?: boolean;
  sockIn?: number;
  sockOut?: number;
  sockUnsent?: number;
}

/** One line per lane: where its bytes wait (queued in the engine, in the socket) and its I/O thread's state. */
export function describeLane(name: string, s: LaneState): string {
  const th = `I/O thread ${s.thread} ${s.sleepFlag === 1 ? 'asleep' : s.sleepFlag === 0 ? 'awake' : `with sleeping flag ${s.sleepFlag}`} after ${s.passes} passes${s.wakeCount > 0 ? ` (${s.wakeCount} wake-up(s) unread)` : ''}${s.inCall ? ', inside a provider call' : ''}, ${s.subsWaiting ?? '?'} submission(s) not taken, ${s.cqesWaiting ?? '?'} completion(s) not polled`;
  const pt = s.ptSpinning === undefined ? '' : `; protocol thread ${s.ptSpinning ? 'polling' : 'not polling'}, wake-up ${s.ptWakePending ? 'asked' : 'not asked'}${s.ptWakeReadable ? ' and waiting' : ''}`;
  if (!s.locked) return `${name} lane ${s.lane}: its lock held for 50 ms; ${th}${pt}`;
  const flags = [s.closed && 'closed', s.closing && 'closing', s.err && `error ${s.err}`, s.eof && 'peer ended', s.hup && 'hangup seen', s.listed && 'listed to run', s.rxStalled && 'receive ring full'].filter(Boolean);
  const rx = s.rxCapacity ? `, receive ring ${((s.rxWritten ?? 0) - (s.rxConsumed ?? 0)) >>> 0} of ${s.rxCapacity} bytes unparsed` : '';
  return `${name} lane ${s.lane}: ${s.writes} write(s) queued (${s.writeBytes} bytes left), ${s.reads} read(s) queued (${s.readBytes} bytes left)${rx}; socket ${s.sockIn} bytes unread, ${s.sockUnsent} unsent, ${s.sockOut} unacknowledged${flags.length ? `; ${flags.join(', ')}` : ''}; ${th}${pt}`;
}

interface LaneRef {
  lane: number;
  thread: number;
}

class NativeRx implements RxRing {
  readonly bytes: Uint8Array;
  readonly view: DataView;
  readonly mask: number;
  private readonly hdr: Uint32Array;
  private resumed = 0; // the stall last answered

  constructor(buf: ArrayBuffer, private readonly resume: () => void) {
    this.hdr = new Uint32Array(buf, 0, RX.bytes / 4);
    const cap = this.hdr[RX.capacity / 4];
    this.bytes = new Uint8Array(buf, RX.bytes, cap);
    this.view = new DataView(buf, RX.bytes, cap);
    this.mask = cap - 1;
  }

  written(): number {
    return Atomics.load(this.hdr, RX.written / 4);
  }

  release(to: number): void {
    Atomics.store(this.hdr, RX.consumed / 4, to >>> 0);
    // The I/O thread stopped reading for lack of room: tell it there is some, once per stall.
    const stall = Atomics.load(this.hdr, RX.stalled / 4);
    if (stall !== this.resumed) {
      this.resumed = stall;
      this.resume();
    }
  }
}

export class NativeLink implements StreamLink, CqeHandler {
  readonly rx: RxRing;
  readonly lanes: number;
  heard: number;
  wrote: number;
  private readonly id: number;
  private readonly ctl: LaneRef;
  private readonly data: LaneRef[];
  private events: LinkEvents | undefined;
  private early: number | undefined; // an rx status that came before attach
  private closed = false;

  /** Adopts the connected sockets (control first); rxBytes is the control lane's receive ring. */
  constructor(
    private readonly port: Port,
    private readonly binding: LaneBinding,
    fds: number[],
    readonly policy: SchedulePolicy,
    readonly description: string,
    rxBytes: number,
  ) {
    this.id = port.addLink(this);
    this.heard = this.wrote = monoMs(); // port.now is the last turn's: a control call may come long after
    const adopted: LaneRef[] = [];
    try {
      const c = binding.ioAdopt(fds[0], -1, this.id, rxBytes);
      adopted.push(c);
      this.rx = new NativeRx(c.rx!, () => this.port.submit(c.thread, c.lane, this.id, 0, SubKind.RX_RESUME, SUB_F_NOCQE, 0, 0, 0));
      for (const fd of fds.slice(1)) adopted.push(binding.ioAdopt(fd, -1, this.id, 0));
    } catch (e) {
      for (const l of adopted) binding.ioClose(l.lane, false);
      port.removeLink(this.id);
      throw e;
    }
    this.ctl = adopted[0];
    this.data = adopted.slice(1);
    this.lanes = this.data.length;
  }

  attach(events: LinkEvents): void {
    this.events = events;
    if (this.early !== undefined) events.onRx(this.early);
  }

  onOp(op: number, status: number, _value: number, time: number, io: number): void {
    // io -1: a frame this thread wrote itself (Port.submitFrame). That is no word from the peer,
    // and port.now is the time of the last poll that found completions in a ring, which may be
    // long past: taking it moved heard back, and a request pending at the next tick failed as
    // if the peer had been silent since (a first comm made more than the timeout after the
    // port's last completion, as in the C driver's `stranger`).
    if (io >= 0) this.heard = this.port.now;
    this.events?.onOp(op, status, time, io);
  }

  onRx(status: number, _value = 0, time = 0, io = 0): void {
    this.heard = this.port.now;
    if (this.events) this.events.onRx(status, time, io);
    else if (this.early === undefined || status !== STATUS_OK) this.early = status;
  }

  frame(type: number, flags: number, tag: number, seq: number, size: number, hi: number, lo: number, len: number, op: number): void {
    const p = this.port;
    p.submitFrame(this.ctl.thread, this.ctl.lane, this.id, op < 0 ? 0 : op, op < 0 ? SUB_F_NOCQE : 0, hi, lo, len, type, flags, tag, seq, size);
    this.wrote = p.now;
  }

  write(lane: number, hi: number, lo: number, len: number, op: number): void {
    const l = this.data[lane];
    this.port.submit(l.thread, l.lane, this.id, op, SubKind.WRITE, 0, hi, lo, len);
    this.wrote = this.port.now;
  }

  read(lane: number, hi: number, lo: number, len: number, op: number): void {
    const l = this.data[lane];
    this.port.submit(l.thread, l.lane, this.id, op, hi === 0 && lo === 0 ? SubKind.DISCARD : SubKind.READ, 0, hi, lo, len);
  }

  /** The engine's view of each lane, one line each (for the WARN of a link gone quiet). */
  describe(): string[] {
    if (this.closed) return [];
    return [this.ctl, ...this.data].map((l, i) => {
      try {
        return describeLane(i === 0 ? 'control' : `data ${i - 1}`, this.binding.ioLaneState(l.lane));
      } catch (e) {
        return `lane ${l.lane}: ${(e as Error).message}`;
      }
    });
  }

  cancel(base: number, len: number): { reads: number; writes: number } {
    if (this.closed) return { reads: 0, writes: 0 }; // nothing of a closed link touches memory
    this.port.drain(); // every read queued so far is in the engine, where ioCancel finds it
    let reads = 0;
    let writes = 0;
    for (const l of [this.ctl, ...this.data]) {
      const r = this.binding.ioCancel(l.lane, base, len);
      reads += r.reads;
      writes += r.writes;
    }
    return { reads, writes };
  }

  close(graceful: boolean): boolean {
    if (this.closed) return true;
    this.closed = true;
    try {
      this.port.drain(); // everything queued (a CLOSE frame) reaches the I/O threads first
    } catch (e) {
      log.warn(`closing ${this.description}: ${(e as Error).message}`);
    }
    let clean = true;
    for (const l of [this.ctl, ...this.data]) {
      try {
        if (this.binding.ioClose(l.lane, graceful).hard) clean = false;
      } catch (e) {
        log.warn(`closing lane ${l.lane}: ${(e as Error).message}`);
      }
    }
    this.port.removeLink(this.id);
    this.events = undefined;
    return clean && graceful;
  }
}
