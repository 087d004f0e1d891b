// The in-process loopback transport: two comms of one process exchange bytes in memory
// (memory-link.ts). Tests use it to run the whole protocol (framing, matching, striping)
// through the real library without sockets. One protocol thread only: both ends of a link
// must live in the same JavaScript thread.
import type { Config } from '../config';
import { invalidArgument } from '../errors';
import type { Regions } from '../memory';
import { type SchedulePolicy, configuredPolicy } from '../protocol/policies';
import { SEND_RING_BYTES, type StreamLink, recvRingBytes } from '../protocol/link';
import { guidOf, hostId } from './guid';
import { memoryLinkPair } from './memory-link';
import { recvComm, sendComm } from './stream';
import { type CommHooks, type Connector, type Device, HOST_MEMORY_TRAITS, type Listener, type RecvComm, type Transport } from './transport';

const HANDLE_MAGIC = 0x4c50_4e54; // "TNPL"
const listeners = new Map<number, LoopListener>();
let nextListener = 1;

class LoopListener implements Listener {
  readonly handle = new Uint8Array(24);
  readonly id = nextListener++;
  readonly nonce = (Math.random() * 2 ** 32) >>> 0;
  readonly pending: StreamLink[] = [];

  constructor(readonly dev: number) {
    const dv = new DataView(this.handle.buffer);
    dv.setUint32(0, HANDLE_MAGIC, true);
    dv.setUint32(4, process.pid, true);
    dv.setUint32(8, this.id, true);
    dv.setUint32(12, this.nonce, true);
    dv.setUint32(16, dev, true);
    listeners.set(this.id, this);
  }
  accept(hooks: CommHooks): RecvComm | undefined {
    const link = this.pending.shift();
    return link && recvComm(link, hooks);
  }
  close(): void {
    listeners.delete(this.id);
    this.pending.splice(0).forEach((l) => l.close(false));
  }
}

export class LoopbackTransport implements Transport {
  readonly name = 'loopback';
  readonly traits = HOST_MEMORY_TRAITS;
  readonly devices: Device[];
  private readonly policy: SchedulePolicy;

  constructor(config: Config, private readonly memory: Regions) {
    this.devices = Array.from({ length: config.loopbackDevices }, (_, i) => ({
      name: `tsnet-loop${i}`,
      pciPath: null,
      // Virtual, owning nothing: named like a virtual NIC of the TCP transport (tcp/devices.ts).
      guid: guidOf(`if:${hostId()}/tsnet-loop${i}/`),
      speedMbps: 100000,
      rails: 1,
    }));
    this.policy = configuredPolicy(config);
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
    const rings = { send: SEND_RING_BYTES, recv: recvRingBytes(this.policy.eagerMax) };
    const [mine, theirs] = memoryLinkPair(this.memory, this.policy, rings, `loopback dev ${dev} -> listener ${l.id}`);
    l.pending.push(theirs);
    let taken = false;
    return {
      poll: (hooks) => {
        if (taken) return undefined;
        taken = true;
        return sendComm(mine, hooks);
      },
      close: () => mine.close(false),
    };
  }

  poll(): void {}
  flush(): boolean {
    return false;
  }
}
