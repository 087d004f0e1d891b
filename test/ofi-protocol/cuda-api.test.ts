// GPU memory and CUDA calls inside libfabric (TSNET_OFI_CUDA_API): what the transport asks
// libfabric for and what it logs. Discovery itself (which providers accept
// FI_OPT_CUDA_API_PERMITTED = false) is tested against real providers in test/ofi/.
import { beforeEach, describe, expect, it, vi } from 'vitest';
import type { OfiBinding, OfiNicInfo } from '../../plugin/transports/ofi/native-rail';
import { nicInfo } from './nic-info';

const nic = nicInfo;

// The transport module keeps libfabric's answer for the process: a fresh module per test.
async function transport() {
  vi.resetModules();
  return import('../../plugin/transports/ofi/transport');
}

describe('CUDA calls inside libfabric', () => {
  let asked: Parameters<OfiBinding['ofiOpen']>[0][];
  let binding: OfiBinding;
  beforeEach(() => {
    asked = [];
    binding = {
      ofiOpen: (opts: Parameters<OfiBinding['ofiOpen']>[0]) => {
        asked.push(opts);
        return { version: 'libfabric 1.22', progress: 'FI_PROGRESS_MANUAL', nics: [nic({})] };
      },
    } as unknown as OfiBinding;
  });

  it('openOfi asks for GPU memory without CUDA calls unless told otherwise, for the senders (FI_SOURCE) and for doorbells unless told not to', async () => {
    const t = await transport();
    t.openOfi(binding);
    expect(asked).toEqual([{ hmem: true, cudaApi: false, dmabuf: true, source: true, bell: true }]);
    const u = await transport();
    u.openOfi(binding, true);
    expect(asked[1]).toEqual({ hmem: true, cudaApi: true, dmabuf: true, source: true, bell: true });
    const w = await transport();
    w.openOfi(binding, false, false);
    expect(asked[2]).toEqual({ hmem: true, cudaApi: false, dmabuf: false, source: true, bell: true });
    const x = await transport();
    x.openOfi(binding, false, true, false);
    expect(asked[3]).toEqual({ hmem: true, cudaApi: false, dmabuf: true, source: false, bell: true })
    const y = await transport();
    y.openOfi(binding, false, true, true, false);
    expect(asked[4]).toEqual({ hmem: true, cudaApi: false, dmabuf: true, source: true, bell: false });
  });

  it('says whether GPU memory is registered, and whether libfabric calls CUDA on tsnet threads', async () => {
    const { OfiTransport } = await transport();
    const lines = (n: Partial<OfiNicInfo>) => OfiTransport.describe({ version: 'libfabric 1.22', progress: 'FI_PROGRESS_MANUAL', nics: [nic(n)] }).join('\n');
    const why = "shm calls CUDA inside libfabric on tsnet's threads (fi_setopt(FI_OPT_CUDA_API_PERMITTED, false): Operation not supported), which can deadlock";
    expect(lines({ hmemWhy: why })).toContain(`ofi: host memory only: ${why}`);
    expect(lines({ hmem: true, noCudaApi: true })).toMatch(/GPU memory is registered directly \(FI_HMEM, CUDA\); libfabric makes no CUDA call \(FI_OPT_CUDA_API_PERMITTED\)$/m);
    const warned = lines({ hmem: true, noCudaApi: false });
    expect(warned).toMatch(/GPU memory is registered directly \(FI_HMEM, CUDA\), and shm calls CUDA on tsnet's I\/O threads \(TSNET_OFI_CUDA_API=1\): this can deadlock/);
    expect(warned).not.toMatch(/makes no CUDA call/);
  });
});

describe('an I/O thread stuck inside a provider call', () => {
  it('is reported at half the link timeout (at least 1 s) in a WARN that names the thread, the call and the known causes', async () => {
    const { stallWarnings } = await transport();
    const asked: number[] = [];
    const stall = { thread: 3, lane: 17, ms: 5234, call: 'a completion queue poll' };
    const binding = { ioStalls: (ms: number) => (asked.push(ms), [stall]) };
    const [line, ...rest] = stallWarnings(binding, 'shm', 10_000);
    expect(rest).toEqual([]);
    expect(asked).toEqual([5000]);
    expect(line).toMatch(/^ofi: I\/O thread 3 has been inside a completion queue poll \(lane 17, shm\) for 5\.2 s and most likely will not return/);
    expect(line).toMatch(/fail when their peers stay silent for 10 s/);
    expect(line).toMatch(/TSNET_OFI_CUDA_API=1/);
    expect(line).toMatch(/TSNET_STALL_STACKS=<file> writes every thread's stack then$/);
    stallWarnings(binding, 'shm', 1000);
    expect(asked[1]).toBe(1000);
    expect(stallWarnings({ ioStalls: () => [] }, 'shm', 10_000)).toEqual([]);
    expect(stallWarnings({}, 'shm', 10_000)).toEqual([]); // an engine without the function
  });
});

describe('endpoints whose close gave up on a stuck I/O thread, at the last finalize', () => {
  it('are waited for, bounded; an INFO when they closed, a WARN naming /dev/shm when some are still open', async () => {
    const { abandonedLines } = await transport();
    expect(abandonedLines({}, 5000)).toEqual({}); // an engine without the function
    const asked: number[] = [];
    const none = { ofiAwaitAbandoned: (ms: number) => (asked.push(ms), 0) };
    expect(abandonedLines(none, 5000)).toEqual({});
    expect(asked).toEqual([0]); // nothing abandoned: no wait at all
    let t = 0;
    const clock = () => t;
    const closing = { ofiAwaitAbandoned: (ms: number) => (asked.push(ms), ms ? ((t += 120), 0) : 2) };
    expect(abandonedLines(closing, 5000, clock)).toEqual({
      info: 'ofi: the last finalize waited 120 ms for I/O threads to close the endpoints whose close had given up on them; all are closed',
    });
    expect(asked.slice(1)).toEqual([0, 5000]);
    const stuck = { ofiAwaitAbandoned: (ms: number) => (ms ? ((t += 5000), 1) : 1) };
    const { info, warn } = abandonedLines(stuck, 5000, clock);
    expect(info).toBeUndefined();
    expect(warn).toMatch(/^ofi: 1 endpoint\(s\) whose close gave up on an I\/O thread stuck inside libfabric are still open 5000 ms after the last finalize; /);
    expect(warn).toMatch(/leaves their shm regions in \/dev\/shm$/);
  });
});

describe('TSNET_STALL_STACKS at a stall', () => {
  it('dumps every thread\'s stack once per process and says where, or why not', async () => {
    const { stallStacksLine } = await transport();
    const asked: string[] = [];
    const binding = { dumpStacks: (f: string) => (asked.push(f), { threads: 41, answered: 39, file: '/tmp/s-77.txt' }) };
    expect(stallStacksLine(binding, '/tmp/s-%p.txt')).toBe(
      "ofi: the stacks of this process's 41 threads are in /tmp/s-77.txt (TSNET_STALL_STACKS; 39 of them answered: a thread that blocks the signal cannot)",
    );
    expect(stallStacksLine(binding, '/tmp/s-%p.txt')).toBeUndefined();
    expect(asked).toEqual(['/tmp/s-%p.txt']);
    const other = await transport();
    const failing = { dumpStacks: () => { throw new Error('dumpStacks: cannot open /nope/x: No such file or directory'); } };
    expect(other.stallStacksLine(failing, '/nope/x')).toBe('ofi: TSNET_STALL_STACKS: dumpStacks: cannot open /nope/x: No such file or directory');
    const third = await transport();
    expect(third.stallStacksLine({}, '/tmp/x')).toBeUndefined(); // an engine without the function
  });
});
