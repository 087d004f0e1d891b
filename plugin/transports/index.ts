// The configured transport of a protocol thread.
import type { Config } from '../config';
import type { LaneBinding } from '../engine/native-link';
import type { Port } from '../engine/port';
import { log } from '../log';
import type { Regions } from '../memory';
import { LoopbackTransport } from './loopback';
import type { OfiBinding } from './ofi/native-rail';
import { OfiTransport, openOfi } from './ofi/transport';
import { TcpTransport } from './tcp';
import type { Transport } from './transport';

/** thread: this protocol thread (thread 0 logs what the process shares). */
export function makeTransport(config: Config, regions: Regions, binding: LaneBinding & OfiBinding, port: () => Port, thread: number): Transport {
  if (config.transport === 'loopback') return new LoopbackTransport(config, regions);
  if (config.transport === 'ofi') {
    const opened = openOfi(binding, config.ofi!.cudaApi, config.ofi!.dmabuf, config.ofi!.checkSender);
    if (thread === 0) for (const l of OfiTransport.describe(opened, config.ofi!.forceRails, config.ofi!.dmabuf)) log.info(l);
    return new OfiTransport(config, config.ofi!, binding, opened, port, config.latencyUs);
  }
  return new TcpTransport(config, { binding, port: port() });
}
