// The endpoints a protocol thread opens for one device: one per rail, a NIC repeated by
// OFI_NCCL_FORCE_NUM_RAILS included, each on an I/O thread the engine picks; the INFO lines
// that say so, and the shm hint about rails. Over a fake binding and port: what the
// transport asks the native engine for, not what libfabric does (test/driver/ofi.test.ts runs
// a repeated NIC through shm).
import { afterEach, describe, expect, it } from 'vitest';
import type { OfiEndpoint } from '../../plugin/transports/ofi/endpoint';
import type { Config } from '../../plugin/config';
import type { Port } from '../../plugin/engine/port';
import { setLogSink } from '../../plugin/log';
import { OFI_DEFAULTS, type OfiConfig } from '../../plugin/transports/ofi/config';
import type { OfiBinding, OfiNicInfo } from '../../plugin/transports/ofi/native-rail';
import { OfiTransport, railsLine } from '../../plugin/transports/ofi/transport';
import { nicInfo } from './nic-info';

const nic = (domain: string, over: Partial<OfiNicInfo> = {}): OfiNicInfo =>
  nicInfo({ domain, guid: BigInt(domain.length), describe: `${domain} domain`, ...over });

/** A fake engine: endpoints on I/O threads round-robin over 8, as ofiRail(nic, -1) does. */
function fakeEngine() {
  const rails: { nic: number; thread: number }[] = [];
  const closed: number[] = [];
  let mr = 1;
  const answer = () => ({ mr: mr++, key: 0n, keyLo: 0, keyHi: 0, remoteBase: 0, ipc: false, ipcWhy: '', device: -1 });
  const binding = {
    ofiRail: (n: number, thread: number) => {
      expect(thread).toBe(-1);
      rails.push({ nic: n, thread: rails.length % 8 });
      const lane = rails.length;
      return { lane, thread: (lane - 1) % 8, name: new Uint8Array(16).fill(lane) };
    },
    ofiInsertPeer: () => 0,
    ofiAlloc: (_lane: number, bytes: number) => ({ ...answer(), addr: 4096, buffer: new ArrayBuffer(bytes) }),
    ofiRegMr: answer,
    ofiDeregMr: () => {},
    ofiLastError: () => '',
    ioClose: (lane: number) => (closed.push(lane), { partial: false, hard: false }),
  } as unknown as OfiBinding;
  let links = 0;
  const port = { addLink: () => links++, removeLink: () => {}, submitOfi: () => {}, submitOfiRecv: () => {}, flush: () => {} } as unknown as Port;
  return { rails, closed, binding, port };
}

function transport(nics: OfiNicInfo[], forceRails: number, groups?: string) {
  const e = fakeEngine();
  const config = { deviceGroups: groups, timeoutSec: 10 } as unknown as Config;
  const ofi: OfiConfig = { ...OFI_DEFAULTS, forceRails };
  const opened = { version: 'libfabric 1.22', progress: 'FI_PROGRESS_MANUAL', nics };
  return { t: new OfiTransport(config, ofi, e.binding, opened, () => e.port, 0), ...e };
}

describe('endpoints per rail', () => {
  afterEach(() => setLogSink(() => {}));

  it('one NIC, no OFI_NCCL_FORCE_NUM_RAILS: one endpoint', () => {
    const { t, rails } = transport([nic('shm')], 0);
    t.listen(0);
    expect(rails).toEqual([{ nic: 0, thread: 0 }]);
  });

  it('OFI_NCCL_FORCE_NUM_RAILS=3 on one NIC: three endpoints of that NIC, on three I/O threads, logged', () => {
    const lines: string[] = [];
    setLogSink((_level, _flags, msg) => lines.push(msg));
    const { t, rails } = transport([nic('shm')], 3);
    t.listen(0);
    t.listen(0); // a device's endpoints are opened once per protocol thread
    expect(rails.map((r) => r.nic)).toEqual([0, 0, 0]);
    expect(rails.map((r) => r.thread)).toEqual([0, 1, 2]);
    expect(lines.filter((l) => l.includes('rail(s)'))).toEqual(['ofi shm: 3 rail(s) on 1 NIC(s), endpoints on I/O thread(s) 0, 1, 2']);
  });

  it('two NICs in one device: 4 forced rails alternate the NICs; 1 forced rail takes the first', () => {
    const two = [nic('a'), nic('bb')];
    const four = transport(two, 4, 'a+bb');
    four.t.listen(0);
    expect(four.rails.map((r) => r.nic)).toEqual([0, 1, 0, 1]);
    const one = transport(two, 1, 'a+bb');
    one.t.listen(0);
    expect(one.rails.map((r) => r.nic)).toEqual([0]);
  });

  it('release closes every endpoint of a repeated NIC', () => {
    const { t, rails, closed } = transport([nic('shm')], 2);
    t.listen(0);
    t.release();
    expect(closed.sort()).toEqual(rails.map((_r, i) => i + 1));
  });

  /** The INFO lines of releasing an shm transport whose endpoint's stats are set to stats. */
  function releaseLines(stats: Partial<OfiEndpoint['stats']>): string[] {
    const lines: string[] = [];
    setLogSink((_level, _flags, msg) => lines.push(msg));
    const a = transport([nic('shm')], 0);
    a.t.listen(0);
    Object.assign((a.t as unknown as { endpoints: (OfiEndpoint | undefined)[] }).endpoints[0]!.stats, stats);
    a.t.release();
    return lines;
  }

  it('release says at INFO how many inputs the sender check dropped and let pass unnamed; nothing when none', () => {
    const lines = releaseLines({ foreign: 3, unnamed: 7 });
    const b = transport([nic('tcp')], 0);
    b.t.listen(0);
    b.t.release();
    expect(lines.filter((l) => l.includes('were dropped'))).toEqual([
      "ofi shm: 3 message(s) and write(s) from senders that were not the named comm's peer were dropped; 7 named AV id 0 (not known to the provider) passed",
    ]);
    expect(lines.filter((l) => l.includes('CLOSE'))).toEqual([]);
  });

  it("release says at INFO how many comms heard their peer's CLOSE, CONNECTs were refused and inputs for closed comms were dropped", () => {
    const lines = releaseLines({ peerClosed: 6, refused: 1, staleMessages: 2, staleWrites: 4 });
    expect(lines.filter((l) => l.includes('CLOSE'))).toEqual([
      "ofi shm: 6 comm(s) heard their peer's CLOSE; 1 CONNECT(s) refused; 2 message(s) and 4 write(s) for comms already closed dropped",
    ]);
  });

  it('the INFO line names the rails, the NICs and the I/O threads', () => {
    expect(railsLine([{ thread: 0 }, { thread: 3 }], 1)).toBe('2 rail(s) on 1 NIC(s), endpoints on I/O thread(s) 0, 3');
  });
});
