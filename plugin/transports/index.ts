// The configured transport of a protocol thread.
import * as fs from 'fs';
import type { Config } from '../config';
import type { LaneBinding } from '../engine/native-link';
import type { Port } from '../engine/port';
import { log } from '../log';
import type { Regions } from '../memory';
import { LoopbackTransport } from './loopback';
import type { OfiBinding } from './ofi/native-rail';
import { chooseRails } from './ofi/policy/rails';
import { OfiTransport, openOfi } from './ofi/transport';
import { TcpTransport } from './tcp';
import type { DialBinding } from './tcp/dial';
import type { Transport } from './transport';

/** Free bytes in /dev/shm, or undefined where it cannot be read. */
function devShmFree(): number | undefined {
  try {
    const st = fs.statfsSync('/dev/shm');
    return st.bavail * st.bsize;
  } catch {
    return undefined;
  }
}

/** thread: this protocol thread (thread 0 logs what the process shares). */
export function makeTransport(config: Config, regions: Regions, binding: LaneBinding & OfiBinding & DialBinding, port: () => Port, thread: number): Transport {
  if (config.transport === 'loopback') return new LoopbackTransport(config, regions);
  if (config.transport === 'ofi') {
    const opened = openOfi(binding, config.ofi!.cudaApi, config.ofi!.dmabuf, config.ofi!.checkSender, config.ofi!.bell);
    const rails = chooseRails(config.ofi!, {
      provider: opened.nics[0].provider,
      nics: opened.nics.length,
      cores: config.cores,
      ioThreads: config.ioThreads,
      shmFree: devShmFree,
    });
    const ofi = { ...config.ofi!, forceRails: rails.forceRails, smallRail: rails.smallRail };
    if (thread === 0) {
      for (const l of OfiTransport.describe(opened, ofi.dmabuf)) log.info(l);
      if (rails.line) log.info(rails.line);
    }
    return new OfiTransport(config, ofi, binding, opened, port, config.latencyUs);
  }
  return new TcpTransport(config, { binding, port: port() });
}
