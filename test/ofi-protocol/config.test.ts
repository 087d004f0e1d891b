// The ofi transport's variables: defaults, each variable, and a bad value naming the variable.
import { describe, expect, it } from 'vitest';
import { NetError } from '../../plugin/errors';
import { OFI_DEFAULTS, readOfiConfig } from '../../plugin/transports/ofi/config';

const read = (env: Record<string, string>) => readOfiConfig(env).config;

describe('ofi config', () => {
  it('defaults follow aws-ofi-nccl', () => {
    const { config, lines } = readOfiConfig({});
    expect(config).toEqual(OFI_DEFAULTS);
    expect(config).toMatchObject({ eagerMax: 8192, minStripe: 131072, smallRrMax: 64, rrCtrl: true, forceRails: 0, bouncePosted: 64 });
    expect(config.flush).toEqual({ method: 'read', all: false });
    expect(lines).toContain('ofi eager max bytes (header included) = 8192 (default)');
  });

  it('reads every variable', () => {
    const c = read({
      OFI_NCCL_EAGER_MAX_SIZE: '-1',
      OFI_NCCL_MIN_STRIPE_SIZE: '4096',
      OFI_NCCL_SCHED_MAX_SMALL_RR_SIZE: '128',
      OFI_NCCL_RR_CTRL_MSG: '0',
      OFI_NCCL_FORCE_NUM_RAILS: '2',
      OFI_NCCL_RDMA_MIN_POSTED_EAGER_BUFFERS: '16',
    });
    expect(c).toMatchObject({ eagerMax: -1, minStripe: 4096, smallRrMax: 128, rrCtrl: false, forceRails: 2, bouncePosted: 16 });
  });

  it('chooses the flush from TSNET_FLUSH and the OFI_NCCL flush variables', () => {
    expect(read({ OFI_NCCL_GDR_FLUSH_DISABLE: '1' }).flush).toEqual({ method: 'none', all: false });
    expect(read({ OFI_NCCL_ENABLE_FLUSH_RDMA_WRITE: '1' }).flush).toEqual({ method: 'write-read', all: false });
    expect(read({ TSNET_FLUSH: 'auto', OFI_NCCL_ENABLE_FLUSH_RDMA_WRITE: 'true' }).flush).toEqual({ method: 'write-read', all: false });
    expect(read({ TSNET_FLUSH: 'read' }).flush).toEqual({ method: 'read', all: true });
    expect(read({ TSNET_FLUSH: 'Write-Read' }).flush).toEqual({ method: 'write-read', all: true });
    expect(read({ TSNET_FLUSH: 'none', OFI_NCCL_ENABLE_FLUSH_RDMA_WRITE: '1' }).flush).toEqual({ method: 'none', all: false });
  });

  it('TSNET_OFI_GPU_IPC: off by default, on with a line that says so', () => {
    expect(OFI_DEFAULTS.gpuIpc).toBe(false);
    const { config, lines } = readOfiConfig({ TSNET_OFI_GPU_IPC: 'yes' });
    expect(config.gpuIpc).toBe(true);
    expect(lines.join('\n')).toMatch(/CUDA IPC to peers in other processes \(FI_HMEM_DEVICE_ONLY\) = true \(TSNET_OFI_GPU_IPC\)/);
    expect(() => read({ TSNET_OFI_GPU_IPC: 'maybe' })).toThrow(/TSNET_OFI_GPU_IPC=maybe: expected 0 or 1/);
  });

  it('TSNET_OFI_CUDA_API: off by default (no CUDA calls inside libfabric), on with a line that warns', () => {
    expect(OFI_DEFAULTS.cudaApi).toBe(false);
    expect(readOfiConfig({}).lines.join('\n')).not.toMatch(/TSNET_OFI_CUDA_API/);
    const { config, lines } = readOfiConfig({ TSNET_OFI_CUDA_API: '1' });
    expect(config.cudaApi).toBe(true);
    expect(lines.join('\n')).toMatch(/GPU memory even where libfabric calls CUDA on tsnet's threads \(can deadlock\) = true \(TSNET_OFI_CUDA_API\)/);
    expect(read({ TSNET_OFI_CUDA_API: 'no' }).cudaApi).toBe(false);
    expect(() => read({ TSNET_OFI_CUDA_API: 'sometimes' })).toThrow(/TSNET_OFI_CUDA_API=sometimes: expected 0 or 1/);
  });

  it('TSNET_OFI_BELL: doorbells on by default, off with a line that says so', () => {
    expect(OFI_DEFAULTS.bell).toBe(true);
    expect(readOfiConfig({}).lines.join('\n')).not.toMatch(/TSNET_OFI_BELL/);
    const { config, lines } = readOfiConfig({ TSNET_OFI_BELL: '0' });
    expect(config.bell).toBe(false);
    expect(lines.join('\n')).toMatch(/doorbells for endpoints without a wait fd = false \(TSNET_OFI_BELL\)/);
    expect(read({ TSNET_OFI_BELL: '1' }).bell).toBe(true);
    expect(() => read({ TSNET_OFI_BELL: 'loud' })).toThrow(/TSNET_OFI_BELL=loud: expected 0 or 1/);
  });

  it('TSNET_OFI_SMALL_RAIL: round-robin by default (aws-ofi-nccl), or one rail per comm', () => {
    expect(OFI_DEFAULTS.smallRail).toBe('rr');
    expect(readOfiConfig({}).lines).toContain("ofi small messages' rails = round-robin (default; one per comm on the rails TSNET_OFI_RAILS=auto adds)");
    expect(OFI_DEFAULTS.smallRailSet).toBe(false);
    const { config, lines } = readOfiConfig({ TSNET_OFI_SMALL_RAIL: ' Comm ' });
    expect(config.smallRail).toBe('comm');
    expect(config.smallRailSet).toBe(true);
    expect(lines).toContain("ofi small messages' rails = one per comm (TSNET_OFI_SMALL_RAIL)");
    expect(read({ TSNET_OFI_SMALL_RAIL: 'rr' }).smallRail).toBe('rr');
  });

  it('TSNET_OFI_RAILS: one rail per NIC by default, or auto; OFI_NCCL_FORCE_NUM_RAILS wins', () => {
    expect(OFI_DEFAULTS.rails).toBe('nics');
    expect(read({ TSNET_OFI_RAILS: ' NICS ' }).rails).toBe('nics');
    expect(read({ TSNET_OFI_RAILS: 'auto' }).rails).toBe('auto');
    expect(() => read({ TSNET_OFI_RAILS: '4' })).toThrow(/TSNET_OFI_RAILS=4: expected auto or nics/);
    const { config, lines } = readOfiConfig({ TSNET_OFI_RAILS: 'auto', OFI_NCCL_FORCE_NUM_RAILS: '2' });
    expect(config.forceRails).toBe(2);
    expect(lines).toContain('ofi TSNET_OFI_RAILS=auto ignored: OFI_NCCL_FORCE_NUM_RAILS=2 is given');
  });

  it('an empty variable counts as unset', () => {
    expect(read({ OFI_NCCL_EAGER_MAX_SIZE: '', TSNET_FLUSH: '', TSNET_OFI_SMALL_RAIL: '', TSNET_OFI_RAILS: '' })).toEqual(OFI_DEFAULTS);
  });

  it.each([
    ['OFI_NCCL_EAGER_MAX_SIZE', '8k', 'expected an integer'],
    ['OFI_NCCL_EAGER_MAX_SIZE', '-2', 'expected -1 to 1048576'],
    ['OFI_NCCL_MIN_STRIPE_SIZE', '0', 'expected 1 to'],
    ['OFI_NCCL_FORCE_NUM_RAILS', '5', 'expected 0 to 4'],
    ['OFI_NCCL_RR_CTRL_MSG', 'maybe', 'expected 0 or 1'],
    ['OFI_NCCL_GDR_FLUSH_DISABLE', '2', 'expected 0 or 1'],
    ['TSNET_FLUSH', 'sometimes', 'expected auto, read, write-read or none'],
    ['TSNET_OFI_SMALL_RAIL', 'home', 'expected rr or comm'],
  ])('%s=%s is an error naming the variable', (name, value, why) => {
    let err: unknown;
    try {
      readOfiConfig({ [name]: value });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(NetError);
    expect((err as NetError).code).toBe(4);
    expect((err as NetError).message).toContain(`${name}=${value}`);
    expect((err as NetError).message).toContain(why);
  });
});
