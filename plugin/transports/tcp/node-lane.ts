// A lane over a Node socket, all on the plugin thread. Writes go straight from the views
// (Node keeps a reference, no copy); reads copy from Node's chunks into the posted views.
// The native I/O lanes (plugin/transports/native-lane.ts) are the fast path; this one
// needs nothing native and serves as the reference.
import type * as net from 'node:net';
import type { Done, Lane } from '../lane';

const PAUSE_ABOVE = 4 << 20;

interface Read {
  view: Uint8Array;
  at: number;
  done: Done;
}

export class NodeLane implements Lane {
  private readonly reads: Read[] = [];
  private readonly chunks: Buffer[] = [];
  private chunkAt = 0;
  private buffered = 0;
  private failed: Error | undefined;
  private corked = false;

  constructor(
    private readonly sock: net.Socket,
    private readonly onFail: (err: Error) => void,
  ) {
    sock.on('data', (c: Buffer) => {
      this.chunks.push(c);
      this.buffered += c.length;
      this.drain();
      if (this.buffered > PAUSE_ABOVE) sock.pause();
    });
    sock.on('end', () => this.fail(new Error('the peer closed the connection')));
    sock.on('error', (e) => this.fail(e));
    sock.on('close', () => this.fail(new Error('the connection closed')));
    sock.resume();
  }

  write(views: Uint8Array[], done: Done): void {
    if (this.failed) return queueMicrotask(() => done(this.failed));
    if (views.length === 0) return queueMicrotask(() => done());
    // Everything written in one turn of the plugin thread leaves in one writev.
    if (!this.corked) {
      this.corked = true;
      this.sock.cork();
      queueMicrotask(() => {
        if (!this.corked) return;
        this.corked = false;
        this.sock.uncork();
      });
    }
    views.forEach((v, i) => this.sock.write(v, i === views.length - 1 ? (err) => done(err ?? undefined) : undefined));
  }

  read(view: Uint8Array, done: Done): void {
    if (this.failed) return queueMicrotask(() => done(this.failed));
    this.reads.push({ view, at: 0, done });
    this.drain();
  }

  close(): void {
    // What this turn wrote (a CLOSE frame) leaves now, before the socket goes.
    if (this.corked) {
      this.corked = false;
      this.sock.uncork();
    }
    this.fail(new Error('closed'));
  }

  private drain(): void {
    while (this.reads.length && this.chunks.length) {
      const r = this.reads[0];
      const c = this.chunks[0];
      const n = Math.min(r.view.length - r.at, c.length - this.chunkAt);
      r.view.set(c.subarray(this.chunkAt, this.chunkAt + n), r.at);
      r.at += n;
      this.chunkAt += n;
      this.buffered -= n;
      if (this.chunkAt === c.length) {
        this.chunks.shift();
        this.chunkAt = 0;
      }
      if (r.at === r.view.length) {
        this.reads.shift();
        r.done();
      }
    }
    // Zero-length reads complete at once.
    while (this.reads.length && this.reads[0].view.length === 0) this.reads.shift()!.done();
    if (this.buffered <= PAUSE_ABOVE && this.sock.isPaused()) this.sock.resume();
  }

  private fail(err: Error): void {
    if (this.failed) return;
    this.failed = err;
    this.sock.destroy();
    const pending = this.reads.splice(0);
    this.chunks.length = 0;
    for (const r of pending) r.done(err);
    this.onFail(err);
  }
}
