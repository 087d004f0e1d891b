// CUDA IPC fences, one for many receives. libfabric's shm moves a written GPU buffer with a
// device-to-device copy that the receiving process issues while it makes progress, and both
// sides' completions come before the copy has run. A copy out of device memory that this
// process issues later on the same GPU waits for every copy issued before it (one default
// stream per device), so a local read of one line of GPU memory orders all of them: once it
// is done, every receive whose writes had all completed when the read was posted is complete.
//
// So receives wait here, per GPU, and one round of reads (one per NIC the waiting comms use)
// serves all of them. A receive that becomes ready while a round is in flight waits for the
// next round: its copy may have been issued after the round's read. A round starts when the
// GPU has none in flight, at the end of the completion batch that made receives ready (so a
// batch's receives share one round), or at once when they became ready outside a batch.
import { hiOf, loOf } from '../../addr';
import { type Completion, type Rail, type Region, ownRegs } from './fabric';
import { FLUSH_READ_AT } from './line';
import { OpKind } from './ops';
import { FLUSH_LINE, flushBytes } from './policy/flush';

/** What the fences need of the endpoint. */
export interface FenceHost {
  readonly rails: readonly Pick<Rail, 'read'>[];
  readonly selfPeer: Int32Array;
  readonly line: Region;
  /** Inside a completion batch: rounds start when it ends (start()). */
  readonly inBatch: boolean;
  readonly ops: { alloc(kind: OpKind, comm: number, serial: number, rail: number, a: number, b: number, c: number): number };
}

/** A comm whose receives wait for fences. */
export interface Fenced {
  /** Receive seq is fenced (ok) or its fence failed (the read's completion, on rail). */
  fenceDone(seq: number, ok: boolean, rail: number, c: Completion): void;
  /** Still open: false once closed or failed (its waiters are dropped). */
  readonly fenceable: boolean;
}

interface Waiter {
  comm: Fenced;
  seq: number;
  nics: number;
  region: Region;
  at: number;
  bytes: number;
}

class DeviceFences {
  /** Reads of the round in flight; 0: none in flight. */
  reads = 0;
  /** The first failed read's completion in this round. */
  failure: { rail: number; c: Completion } | null = null;
  round: Waiter[] = [];
  next: Waiter[] = [];
}

export class Fences {
  private readonly devices = new Map<number, DeviceFences>();
  /** Rounds posted and receives they completed (for tests and stats). */
  rounds = 0;
  fencedReceives = 0;

  constructor(private readonly ep: FenceHost) {}

  /**
   * Receive seq of comm has all its writes: it completes after a round of reads posted from
   * now on. The read is of one line at `at` in region (GPU memory on device), through NICs
   * 0 .. nics-1.
   */
  wait(comm: Fenced, seq: number, device: number, nics: number, region: Region, at: number, bytes: number): void {
    let d = this.devices.get(device);
    if (!d) this.devices.set(device, (d = new DeviceFences()));
    d.next.push({ comm, seq, nics, region, at, bytes });
    if (!this.ep.inBatch && d.reads === 0) this.post(device, d);
  }

  /** End of a completion batch: every GPU with receives waiting and no round in flight posts one. */
  start(): void {
    if (this.devices.size === 0) return; // no GPU buffers: iterating the empty map allocated, once per batch
    for (const [device, d] of this.devices) if (d.reads === 0 && d.next.length) this.post(device, d);
  }

  /** A fence read completed (token's a: the device). Completes the round when it was the last. */
  onDone(device: number, rail: number, c: Completion): void {
    const d = this.devices.get(device);
    if (!d || d.reads === 0) return;
    if (c.status !== 0 && !d.failure) d.failure = { rail, c };
    if (--d.reads > 0) return;
    const round = d.round;
    const failure = d.failure;
    d.round = [];
    d.failure = null;
    for (const w of round)
      if (w.comm.fenceable) {
        if (!failure) this.fencedReceives++;
        w.comm.fenceDone(w.seq, !failure, failure ? failure.rail : rail, failure ? failure.c : c);
      }
    if (!this.ep.inBatch && d.next.length) this.post(device, d);
  }

  /** Receives waiting or in a round. */
  get waiting(): number {
    let n = 0;
    for (const d of this.devices.values()) n += d.round.length + d.next.length;
    return n;
  }

  private post(device: number, d: DeviceFences): void {
    // Receives of comms that closed or failed meanwhile are dropped.
    const round = d.next.filter((w) => w.comm.fenceable);
    d.next = [];
    if (round.length === 0) return;
    d.round = round;
    this.rounds++;
    const first = round[0];
    let nics = 0;
    for (const w of round) if (w.nics > nics) nics = w.nics;
    const ep = this.ep;
    const regs = ownRegs(first.region);
    d.reads = nics;
    for (let nic = 0; nic < nics; nic++) {
      const token = ep.ops.alloc(OpKind.FENCE, 0, 0, nic, device, 0, 0);
      const reg = regs[nic];
      const la = ep.line.base + FLUSH_READ_AT + FLUSH_LINE * nic;
      const ra = first.at + reg.remoteDelta;
      ep.rails[nic].read(ep.selfPeer[nic], hiOf(la), loOf(la), flushBytes(first.bytes), ep.line.regs[nic].desc, hiOf(ra), loOf(ra), reg.keyLo, reg.keyHi, token);
    }
  }
}
