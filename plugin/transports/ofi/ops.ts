// Operations in flight, by token. Every send, write or read an endpoint posts takes an entry
// here (its token is the entry's index, 1 .. 2^29 - 1; 0 is never a token, and tokens from
// BOUNCE_TOKEN, 2^29, on are bounce receives). An entry names the comm by id and serial, so that a
// completion for a comm that has closed, or whose id now belongs to another comm, reaches no
// one; the entry is reused only after its own completion came back.

import { BOUNCE_TOKEN } from './bounce';

export const enum OpKind {
  /** An eager message: a = send record. */
  EAGER = 1,
  /** A stripe of a data write: a = send record. */
  WRITE = 2,
  /** A control message into the peer's mailbox: a = receive sequence. */
  CTRL = 3,
  /** Copy of an eager payload from a bounce buffer into GPU memory: a = receive seq, b = sub-receive, c = bounce buffer. */
  EAGER_COPY = 4,
  /** The write of a write-then-read flush: a = flush record, b = rail. */
  FLUSH_WRITE = 5,
  /** The read of a flush: a = flush record. */
  FLUSH_READ = 6,
  /** CONNECT, ACCEPT or HEARTBEAT: nothing to do but notice errors; a = SETUP_MESSAGE for CONNECT and ACCEPT. */
  MESSAGE = 7,
  /**
   * CUDA IPC: a local read of GPU memory, ordered after the device-to-device copies issued
   * before it on that GPU (a = the GPU's ordinal). The endpoint's own (comm 0): one round of
   * them completes the receives of every comm waiting on that GPU (fence.ts).
   */
  FENCE = 8,
  /** CUDA IPC: the acknowledgement of a fenced receive, written into the sender's mailbox (a = receive sequence). */
  ACK = 9,
  /**
   * The endpoint's own message to a peer (comm 0): a refusal of a CONNECT (a = its slot in the
   * flush line) or the CLOSE of a comm that has closed (a = -1). Nothing waits for it.
   */
  NOTICE = 10,
}

/** MESSAGE ops' a for CONNECT and ACCEPT: their loss is repaired by sending CONNECT again. */
export const SETUP_MESSAGE = 1;

export class OpTable {
  kind = new Uint8Array(1024);
  comm = new Int32Array(1024);
  serial = new Float64Array(1024);
  a = new Int32Array(1024);
  b = new Int32Array(1024);
  c = new Int32Array(1024);
  rail = new Uint8Array(1024);
  private freeList = new Int32Array(1024);
  private top = 0;
  private next = 1;
  /** Entries in flight. */
  inflight = 0;

  /** A token for an operation of comm (id, serial) posted on rail. */
  alloc(kind: OpKind, comm: number, serial: number, rail: number, a: number, b: number, c: number): number {
    let t: number;
    if (this.top > 0) t = this.freeList[--this.top];
    else {
      if (this.next === this.kind.length) this.grow();
      t = this.next++;
    }
    this.kind[t] = kind;
    this.comm[t] = comm;
    this.serial[t] = serial;
    this.rail[t] = rail;
    this.a[t] = a;
    this.b[t] = b;
    this.c[t] = c;
    this.inflight++;
    return t;
  }

  /** True when token names an operation in flight. */
  live(token: number): boolean {
    return token > 0 && token < this.next && this.kind[token] !== 0;
  }

  free(token: number): void {
    this.kind[token] = 0;
    this.freeList[this.top++] = token;
    this.inflight--;
  }

  private grow(): void {
    const n = this.kind.length * 2;
    if (n > BOUNCE_TOKEN) throw new Error('more than 2^29 operations in flight');
    const u8 = (old: Uint8Array) => {
      const x = new Uint8Array(n);
      x.set(old);
      return x;
    };
    const i32 = (old: Int32Array) => {
      const x = new Int32Array(n);
      x.set(old);
      return x;
    };
    this.kind = u8(this.kind);
    this.rail = u8(this.rail);
    this.comm = i32(this.comm);
    this.a = i32(this.a);
    this.b = i32(this.b);
    this.c = i32(this.c);
    const s = new Float64Array(n);
    s.set(this.serial);
    this.serial = s;
    const f = new Int32Array(n);
    f.set(this.freeList);
    this.freeList = f;
  }
}
