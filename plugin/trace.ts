// TSNET_TRACE=FILE: a Chrome/Perfetto trace (JSON array format, opened in chrome://tracing or
// ui.perfetto.dev) of every request: an async slice from the moment NCCL posted it to its
// completion, with steps when a protocol thread picked it up, when its bytes were written and
// when they landed, and named tracks for the threads involved. Every protocol thread of the
// process appends to one file (%p in its name becomes the pid). Off, it costs one check per
// request.
import { OP_NAMES, Op } from './native';
import type { RequestTrace } from './protocol/endpoint';

export interface TraceSink {
  traceWrite(text: string): void;
  now(): number;
}

/** Track ids: NCCL's posting threads, protocol thread k, I/O thread t. */
const NCCL_TID = 1;
const protoTid = (k: number) => 1000 + k;
const ioTid = (t: number) => 2000 + t;

export class Tracer {
  private readonly pid = process.pid;
  private readonly out: string[] = [];
  private readonly ids = new Map<number, Float64Array>(); // comm -> current request id per slot
  private readonly ioNamed = new Set<number>();
  private next = 1;

  constructor(private readonly sink: TraceSink, private readonly thread: number) {
    this.meta(protoTid(thread), thread === 0 ? 'tsnet-plugin (protocol thread 0)' : `tsnet-proto${thread}`);
    if (thread === 0) this.meta(NCCL_TID, 'NCCL (posting threads)');
  }

  forComm(comm: number): RequestTrace {
    return { step: (slot, what, us, io) => this.step(comm, slot, what, us, io) };
  }

  begin(comm: number, slot: number, op: number, size: number, postedUs: number, takenUs: number): void {
    let ids = this.ids.get(comm);
    if (!ids) this.ids.set(comm, (ids = new Float64Array(1024)));
    const id = (ids[slot] = this.next++);
    const name = op === Op.FLUSH ? 'iflush' : `${OP_NAMES[op] ?? op} ${size} B`;
    this.event(`{"ph":"b","cat":"comm ${comm}","name":"${name}","id":${id},"pid":${this.pid},"tid":${NCCL_TID},"ts":${postedUs.toFixed(3)},"args":{"comm":${comm},"slot":${slot},"bytes":${size}}}`);
    this.event(`{"ph":"n","cat":"comm ${comm}","name":"picked up","id":${id},"pid":${this.pid},"tid":${protoTid(this.thread)},"ts":${takenUs.toFixed(3)}}`);
  }

  /** A step of a request on I/O thread io, or (io -1) on this protocol thread. */
  step(comm: number, slot: number, what: string, us: number, io: number): void {
    const id = this.ids.get(comm)?.[slot];
    if (!id || !us) return;
    if (io >= 0 && !this.ioNamed.has(io)) {
      this.ioNamed.add(io);
      this.meta(ioTid(io), `tsnet-io${io}`);
    }
    const tid = io < 0 ? protoTid(this.thread) : ioTid(io);
    this.event(`{"ph":"n","cat":"comm ${comm}","name":"${what}","id":${id},"pid":${this.pid},"tid":${tid},"ts":${us.toFixed(3)}}`);
  }

  end(comm: number, slot: number, code: number): void {
    const id = this.ids.get(comm)?.[slot];
    if (!id) return;
    this.event(`{"ph":"e","cat":"comm ${comm}","id":${id},"pid":${this.pid},"tid":${protoTid(this.thread)},"ts":${this.sink.now().toFixed(3)},"args":{"result":${code}}}`);
  }

  /** Appends what this turn recorded (one write). */
  flush(): void {
    if (this.out.length) this.sink.traceWrite(this.out.splice(0).join(',\n'));
  }

  private meta(tid: number, name: string): void {
    this.event(`{"ph":"M","name":"thread_name","pid":${this.pid},"tid":${tid},"args":{"name":"${name}"}}`);
  }

  private event(e: string): void {
    this.out.push(e);
  }
}
