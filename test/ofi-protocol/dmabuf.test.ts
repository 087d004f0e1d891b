// DMA-BUF registration of GPU memory (NCCL's regMrDmaBuf) in the libfabric transport: when
// getProperties offers it (ptrSupport), the INFO line that says why or why not, and that a
// DMA-BUF region is registered through its fd on every rail during the call, and only then.
// Over a fake binding: what the transport asks the native engine for. What libfabric does with
// FI_MR_DMABUF is tested in test/ofi (scenario dmabuf), the plugin's checks in test/unit and
// the C driver.
import { describe, expect, it } from 'vitest';
import { PtrKind } from '../../plugin/abi';
import { setLogSink } from '../../plugin/log';
import type { Config } from '../../plugin/config';
import type { Port } from '../../plugin/engine/port';
import { Regions } from '../../plugin/memory';
import { OFI_DEFAULTS, readOfiConfig } from '../../plugin/transports/ofi/config';
import type { OfiBinding, OfiNicInfo } from '../../plugin/transports/ofi/native-rail';
import { OfiTransport, dmabufLine } from '../../plugin/transports/ofi/transport';
import { nicInfo } from './nic-info';

const gpuNic = (over: Partial<OfiNicInfo> = {}) => nicInfo({ hmem: true, noCudaApi: false, dmabuf: true, ...over });

/** Records each ofiRegMr call's arguments. */
function fakeEngine() {
  const regs: unknown[][] = [];
  let mr = 1;
  const answer = () => ({ mr: mr++, key: 0n, keyLo: 0, keyHi: 0, remoteBase: 0, ipc: false, device: 0 });
  const binding = {
    ofiRail: () => ({ lane: 1, thread: 0, name: new Uint8Array(16) }),
    ofiInsertPeer: () => 0,
    ofiAlloc: (_lane: number, bytes: number) => ({ ...answer(), addr: 4096, buffer: new ArrayBuffer(bytes) }),
    ofiRegMr: (...args: unknown[]) => (regs.push(args), answer()),
    ofiDeregMr: () => 0,
    ofiLastError: () => '',
    ioClose: () => ({ partial: false, hard: false }),
  } as unknown as OfiBinding;
  const port = { addLink: () => 1, removeLink: () => {}, submitOfi: () => {}, submitOfiRecv: () => {}, flush: () => {} } as unknown as Port;
  return { regs, binding, port };
}

function transport(nics: OfiNicInfo[], over: Partial<typeof OFI_DEFAULTS> = {}) {
  const e = fakeEngine();
  const config = { timeoutSec: 10 } as unknown as Config;
  const opened = { version: 'libfabric 1.22', progress: 'FI_PROGRESS_MANUAL', nics };
  return { t: new OfiTransport(config, { ...OFI_DEFAULTS, ...over }, e.binding, opened, () => e.port, 0), ...e };
}

describe('DMA-BUF registration in the libfabric transport', () => {
  it('is offered (ptrSupport DMA-BUF) only with GPU memory, on every NIC, and not when OFI_NCCL_DISABLE_DMABUF=1', () => {
    const all = PtrKind.HOST | PtrKind.CUDA | PtrKind.DMABUF;
    expect(transport([gpuNic()]).t.traits.ptrSupport).toBe(all);
    expect(transport([gpuNic(), gpuNic({ domain: 'b', dmabuf: false })]).t.traits.ptrSupport).toBe(PtrKind.HOST | PtrKind.CUDA);
    expect(transport([gpuNic()], { dmabuf: false }).t.traits.ptrSupport).toBe(PtrKind.HOST | PtrKind.CUDA);
    expect(transport([gpuNic({ hmem: false })]).t.traits.ptrSupport).toBe(PtrKind.HOST);
  });

  it('OFI_NCCL_DISABLE_DMABUF: on by default, off with 1, and a bad value is an error naming it', () => {
    expect(readOfiConfig({}).config.dmabuf).toBe(true);
    const off = readOfiConfig({ OFI_NCCL_DISABLE_DMABUF: '1' });
    expect(off.config.dmabuf).toBe(false);
    expect(off.lines).toContain('ofi DMA-BUF registration of GPU memory = off (OFI_NCCL_DISABLE_DMABUF)');
    expect(readOfiConfig({ OFI_NCCL_DISABLE_DMABUF: '0' }).config.dmabuf).toBe(true);
    expect(() => readOfiConfig({ OFI_NCCL_DISABLE_DMABUF: 'maybe' })).toThrow(/OFI_NCCL_DISABLE_DMABUF=maybe: expected 0 or 1/);
  });

  it('says at init whether GPU memory may come as a DMA-BUF, and if not, why', () => {
    expect(dmabufLine([gpuNic()], true)).toMatch(/^ofi: GPU memory may be registered through DMA-BUF \(FI_MR_DMABUF\)/);
    const why = 'FI_MR_DMABUF needs libfabric 1.20 or newer; this is libfabric 1.17 (API 1.17)';
    expect(dmabufLine([gpuNic(), gpuNic({ dmabuf: false, dmabufWhy: why })], true)).toBe(`ofi: no DMA-BUF registration of GPU memory: ${why}`);
    expect(dmabufLine([gpuNic()], false)).toBe('ofi: no DMA-BUF registration of GPU memory (OFI_NCCL_DISABLE_DMABUF=1)');
    const opened = (n: OfiNicInfo) => ({ version: 'libfabric 1.22', progress: 'FI_PROGRESS_MANUAL', nics: [n] });
    expect(OfiTransport.describe(opened(gpuNic())).join('\n')).toMatch(/may be registered through DMA-BUF/);
    // Host memory only: nothing to say about DMA-BUF.
    expect(OfiTransport.describe(opened(nicInfo())).join('\n')).not.toMatch(/DMA-BUF/);
  });

  it('registers a DMA-BUF region through its fd on every rail, during the call; a plain region by address', () => {
    const lines: string[] = [];
    setLogSink((_level, _flags, msg) => lines.push(msg));
    const { t, regs } = transport([gpuNic()], { forceRails: 3 });
    const regions = new Regions();
    const dma = regions.add(1, 1, null, 0x7000_0000_0000 + 8192, 65536);
    dma.dmabuf = { fd: 42, offset: 8192 };
    t.register(dma, 0);
    // (The endpoint's own host buffers are registered on the other rails as it opens.)
    const gpu = () => regs.filter((r) => r[3] === true);
    expect(gpu()).toEqual([0, 1, 2].map(() => [1, dma.base, 65536, true, false, 42, 8192]));
    expect(dma.regs).toHaveLength(3);
    regs.length = 0;
    const plain = regions.add(2, 1, null, 0x7000_1000_0000, 4096);
    t.register(plain, 0);
    expect(gpu()).toEqual([0, 1, 2].map(() => [1, plain.base, 4096, true, false]));
    const again = regions.add(3, 1, null, 0x7000_2000_0000, 4096);
    again.dmabuf = { fd: 43, offset: 0 };
    t.register(again, 0);
    expect(lines.filter((l) => l.includes('registered through DMA-BUF'))).toEqual([
      "ofi: GPU memory registered through DMA-BUF (NCCL's regMrDmaBuf: 65536 bytes at offset 8192 of fd 42); said once per protocol thread",
    ]);
    setLogSink(() => {});
  });
});
