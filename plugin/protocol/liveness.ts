// Telling a quiet link from a dead one. Each side of a link notes when it last heard from
// its peer and when it last wrote; a side that wrote nothing for a quarter of the timeout
// sends a HEARTBEAT frame, and a side with requests pending that heard nothing for the whole
// timeout declares the peer dead. A killed peer is seen at once (the kernel resets the
// connection); this catches a peer host that vanished or froze without a word.
import { remoteError, type NetError } from '../errors';
import type { Lane } from '../transports/lane';
import { FrameType, encodeFrame } from './frames';

export class Liveness {
  private heard = Date.now();
  private wrote = Date.now();

  constructor(private readonly name: string) {}

  /** Bytes arrived from the peer. */
  heardNow(): void {
    this.heard = Date.now();
  }

  /** Something was written to the peer. */
  wroteNow(): void {
    this.wrote = Date.now();
  }

  /**
   * Called periodically: sends a HEARTBEAT on control when this side has been quiet, and
   * answers the error to fail with when the peer has been silent too long with work pending.
   */
  tick(now: number, timeoutMs: number, pending: number, control: Lane): NetError | undefined {
    if (now - this.wrote >= timeoutMs / 4) {
      this.wrote = now;
      control.write([encodeFrame({ type: FrameType.HEARTBEAT, flags: 0, tag: 0, seq: -1, size: 0 })], () => {});
    }
    if (pending > 0 && now - this.heard > timeoutMs)
      return remoteError(`${this.name}: nothing heard from the peer for ${((now - this.heard) / 1000).toFixed(1)} s with ${pending} request(s) pending`);
    return undefined;
  }
}
