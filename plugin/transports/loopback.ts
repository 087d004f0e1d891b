// The in-process loopback transport: two comms of one process exchange bytes in memory.
// Each lane direction is a pipe that copies straight from the writer's views into the
// reader's views, so a write completes once the reader has taken its bytes. Tests use it
// to run the whole protocol (framing, matching, striping) through the real library.
import type { Config } from '../config';
import { invalidArgument } from '../errors';
import type { SchedulePolicy } from '../protocol/schedule';
import { type Done, type Lane, LaneLink, type Link } from './lane';
import { type Connector, type Device, HOST_MEMORY_TRAITS, type Listener, type Transport } from './transport';

interface Pending {
  views: Uint8Array[];
  at: number; // bytes of views already moved
  total: number;
  done: Done;
}

/** One direction: writes queue here until reads take their bytes. */
class Pipe {
  private readonly writes: Pending[] = [];
  private readonly reads: Pending[] = [];
  closed: Error | undefined;

  write(views: Uint8Array[], done: Done): void {
    if (this.closed) return queueMicrotask(() => done(this.closed));
    this.writes.push({ views, at: 0, total: views.reduce((n, v) => n + v.length, 0), done });
    this.move();
  }

  read(view: Uint8Array, done: Done): void {
    if (this.closed) return queueMicrotask(() => done(this.closed));
    this.reads.push({ views: [view], at: 0, total: view.length, done });
    this.move();
  }

  close(err: Error): void {
    if (this.closed) return;
    this.closed = err;
    const all = [...this.writes.splice(0), ...this.reads.splice(0)];
    queueMicrotask(() => all.forEach((p) => p.done(err)));
  }

  private move(): void {
    const finished: Done[] = [];
    while (this.writes.length && this.reads.length) {
      const w = this.writes[0];
      const r = this.reads[0];
      if (w.total === w.at) {
        this.writes.shift();
        finished.push(w.done);
        continue;
      }
      const src = locate(w);
      const dst = r.views[0].subarray(r.at);
      const n = Math.min(src.length, dst.length);
      dst.set(src.subarray(0, n));
      w.at += n;
      r.at += n;
      if (w.at === w.total) finished.push(this.writes.shift()!.done);
      if (r.at === r.total) finished.push(this.reads.shift()!.done);
    }
    // An empty write is done at once.
    while (this.writes.length && this.writes[0].total === 0) finished.push(this.writes.shift()!.done);
    if (finished.length) queueMicrotask(() => finished.forEach((d) => d()));
  }
}

// The rest of the pending write's current view.
function locate(w: Pending): Uint8Array {
  let at = w.at;
  for (const v of w.views) {
    if (at < v.length) return v.subarray(at);
    at -= v.length;
  }
  return new Uint8Array(0);
}

class PipeLane implements Lane {
  constructor(
    private readonly out: Pipe,
    private readonly inp: Pipe,
    private readonly failed: (err: Error) => void,
  ) {}
  write(views: Uint8Array[], done: Done): void {
    this.out.write(views, done);
  }
  read(view: Uint8Array, done: Done): void {
    this.inp.read(view, (err) => {
      if (err) this.failed(err);
      done(err);
    });
  }
  close(): void {
    const err = new Error('the loopback peer closed the connection');
    this.out.close(err);
    this.inp.close(err);
  }
}

const HANDLE_MAGIC = 0x4c50_4e54; // "TNPL"
const listeners = new Map<number, LoopListener>();
let nextListener = 1;

class LoopListener implements Listener {
  readonly handle = new Uint8Array(24);
  readonly id = nextListener++;
  readonly nonce = (Math.random() * 2 ** 32) >>> 0;
  readonly pending: Link[] = [];

  constructor(readonly dev: number) {
    const dv = new DataView(this.handle.buffer);
    dv.setUint32(0, HANDLE_MAGIC, true);
    dv.setUint32(4, process.pid, true);
    dv.setUint32(8, this.id, true);
    dv.setUint32(12, this.nonce, true);
    dv.setUint32(16, dev, true);
    listeners.set(this.id, this);
  }
  accept(): Link | undefined {
    return this.pending.shift();
  }
  close(): void {
    listeners.delete(this.id);
    this.pending.splice(0).forEach((l) => l.close());
  }
}

export class LoopbackTransport implements Transport {
  readonly name = 'loopback';
  readonly traits = HOST_MEMORY_TRAITS;
  readonly devices: Device[];
  readonly policy: SchedulePolicy;

  constructor(config: Config) {
    this.devices = Array.from({ length: config.loopbackDevices }, (_, i) => ({
      name: `tsnet-loop${i}`,
      pciPath: null,
      speedMbps: 100000,
      rails: 1,
    }));
    this.policy = { eagerMax: config.eagerMax, minStripe: config.minStripe, lanes: config.nsocks };
  }

  listen(dev: number): Listener {
    return new LoopListener(dev);
  }

  connect(dev: number, handle: Uint8Array): Connector {
    const dv = new DataView(handle.buffer, handle.byteOffset, handle.length);
    if (dv.getUint32(0, true) !== HANDLE_MAGIC) throw invalidArgument('the handle is not a tsnet loopback handle');
    const pid = dv.getUint32(4, true);
    if (pid !== process.pid) throw invalidArgument(`the loopback handle comes from another process (pid ${pid})`);
    const l = listeners.get(dv.getUint32(8, true));
    if (!l || l.nonce !== dv.getUint32(12, true)) throw invalidArgument('no loopback listener matches the handle (closed?)');
    const pipes = Array.from({ length: 1 + this.policy.lanes }, () => [new Pipe(), new Pipe()] as [Pipe, Pipe]);
    const what = `loopback dev ${dev} -> listener ${l.id}`;
    const link = (ends: [Pipe, Pipe][]) => new LaneLink((fail) => ends.map(([out, inp]) => new PipeLane(out, inp, fail)), what);
    const mine = link(pipes);
    l.pending.push(link(pipes.map(([a, b]) => [b, a])));
    return { poll: () => mine, close: () => mine.close() };
  }
}
