// NativeIo / NativeLane over a fake binding: opId routing, batches, ordering of callbacks,
// errors by status, views kept until completion, and the close rule (after close a lane's
// callbacks only ever see an error).
import { describe, expect, it } from 'vitest';
import { NetError } from '../../plugin/errors';
import { setLogSink } from '../../plugin/log';
import { IO_EOF, NativeIo, type IoBinding } from '../../plugin/transports/native-lane';

const ECANCELED = -125;

class FakeBinding implements IoBinding {
  readonly ioStatus = { OK: 0, EOF: IO_EOF, CANCELLED: ECANCELED };
  completions = new Float64Array(8); // 4 records: small, to exercise batching
  onDone: ((n: number) => void) | undefined;
  posted: { kind: string; lane: number; op: number; views: unknown }[] = [];
  closed: number[] = [];
  starts = 0;
  ioStart(threads: number, onDone: (count: number) => void) {
    this.starts++;
    this.onDone = onDone;
    return { completions: this.completions, records: 4, threads };
  }
  ioAdopt(fd: number): number {
    return fd + 100;
  }
  ioWrite(lane: number, views: Uint8Array[], op: number): void {
    this.posted.push({ kind: 'w', lane, op, views });
  }
  ioRead(lane: number, view: Uint8Array, op: number): void {
    this.posted.push({ kind: 'r', lane, op, views: view });
  }
  ioClose(lane: number): void {
    this.closed.push(lane);
  }
  /** Delivers (op, status) pairs like the native side: at most 4 per onDone. */
  complete(pairs: [number, number][]): void {
    for (let i = 0; i < pairs.length; i += 4) {
      const batch = pairs.slice(i, i + 4);
      batch.forEach(([op, st], k) => ((this.completions[2 * k] = op), (this.completions[2 * k + 1] = st)));
      this.onDone!(batch.length);
    }
  }
}

describe('NativeIo over a fake binding', () => {
  it('starts once, lazily, and routes completions to their callbacks in order', () => {
    const b = new FakeBinding();
    const io = new NativeIo(b, 2);
    expect(b.starts).toBe(0);
    const lane = io.adopt(5);
    io.adopt(6);
    expect(b.starts).toBe(1);
    expect(lane.id).toBe(105);
    const seen: string[] = [];
    for (let i = 0; i < 6; i++) lane.write([new Uint8Array(i)], (e) => seen.push(`w${i}${e ? '!' : ''}`));
    lane.read(new Uint8Array(3), (e) => seen.push(`r${e ? '!' : ''}`));
    expect(io.inFlight).toBe(7);
    b.complete(b.posted.map((p) => [p.op, 0]));
    expect(seen).toEqual(['w0', 'w1', 'w2', 'w3', 'w4', 'w5', 'r']);
    expect(io.inFlight).toBe(0);
  });

  it('maps statuses to errors: EOF and resets are remote errors, others carry the errno name', () => {
    const b = new FakeBinding();
    const io = new NativeIo(b, 1);
    const lane = io.adopt(1);
    const errs: (Error | undefined)[] = [];
    for (let i = 0; i < 4; i++) lane.read(new Uint8Array(1), (e) => errs.push(e));
    b.complete([
      [b.posted[0].op, IO_EOF],
      [b.posted[1].op, -104], // ECONNRESET
      [b.posted[2].op, -110], // ETIMEDOUT
      [b.posted[3].op, 0],
    ]);
    expect(errs[0]).toBeInstanceOf(NetError);
    expect(errs[0]!.message).toMatch(/closed the connection/);
    expect(errs[1]).toBeInstanceOf(NetError);
    expect((errs[2] as NodeJS.ErrnoException).code).toBe('ETIMEDOUT');
    expect(errs[3]).toBeUndefined();
  });

  it('after close, callbacks only see ECANCELED, even for an op the I/O thread finished', async () => {
    const b = new FakeBinding();
    const io = new NativeIo(b, 1);
    const lane = io.adopt(1);
    const got: (string | undefined)[] = [];
    const cb = (e?: Error) => got.push(e ? (e as NodeJS.ErrnoException).code : 'ok');
    lane.write([new Uint8Array(4)], cb);
    lane.read(new Uint8Array(4), cb);
    lane.close();
    lane.close();
    expect(b.closed).toEqual([101]);
    lane.write([new Uint8Array(1)], cb); // after close: fails without reaching the binding
    expect(b.posted.length).toBe(2);
    b.complete([
      [b.posted[0].op, 0],
      [b.posted[1].op, ECANCELED],
    ]);
    await Promise.resolve();
    expect(got).toEqual(['ECANCELED', 'ECANCELED', 'ECANCELED']);
  });

  it('keeps a throwing callback from losing the rest of the batch', () => {
    const b = new FakeBinding();
    const io = new NativeIo(b, 1);
    const lane = io.adopt(1);
    let ran = 0;
    const warned: string[] = [];
    setLogSink((_level, _flags, msg) => warned.push(msg));
    lane.read(new Uint8Array(1), () => {
      throw new Error('boom');
    });
    lane.read(new Uint8Array(1), () => ran++);
    b.complete(b.posted.map((p) => [p.op, 0]));
    expect(ran).toBe(1);
    expect(io.inFlight).toBe(0);
    expect(warned.join('\n')).toMatch(/callback threw: Error: boom/);
  });
});
