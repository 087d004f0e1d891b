// Rail choice: rails per device (OFI_NCCL_FORCE_NUM_RAILS subsets or repeats NICs, at most 4),
// both ends agree on the smaller count, rail i runs on NIC i mod NICs, control messages on
// rail 0 or round-robin.
import { describe, expect, it } from 'vitest';
import { OFI_DEFAULTS } from '../../plugin/transports/ofi/config';
import { AUTO_RAILS, AUTO_RAILS_MIN_SHM_FREE, CtrlRails, chooseRails, commRails, deviceRails, homeRail, nicOf, type RailsHost } from '../../plugin/transports/ofi/policy/rails';

describe('rail choice', () => {
  it('a device offers one rail per NIC, at most 4', () => {
    expect(deviceRails(1, 0)).toBe(1);
    expect(deviceRails(3, 0)).toBe(3);
    expect(deviceRails(8, 0)).toBe(4);
  });

  it('OFI_NCCL_FORCE_NUM_RAILS takes a subset or repeats NICs', () => {
    expect(deviceRails(4, 2)).toBe(2);
    expect(deviceRails(1, 3)).toBe(3);
    expect([0, 1, 2, 3].map((i) => nicOf(i, 2))).toEqual([0, 1, 0, 1]);
  });

  it('both ends use the smaller count', () => {
    expect(commRails(4, 2)).toBe(2);
    expect(commRails(1, 3)).toBe(1);
  });

  it('control messages take rail 0, or turns with OFI_NCCL_RR_CTRL_MSG', () => {
    const fixed = new CtrlRails(3, false);
    expect([1, 2, 3, 4].map(() => fixed.pick())).toEqual([0, 0, 0, 0]);
    const rr = new CtrlRails(3, true);
    expect([1, 2, 3, 4, 5].map(() => rr.pick())).toEqual([0, 1, 2, 0, 1]);
  });

  it('TSNET_OFI_SMALL_RAIL=comm: control messages always on the home rail, whatever OFI_NCCL_RR_CTRL_MSG says', () => {
    expect([4, 5, 6, 7, 8].map((id) => homeRail(id, 4))).toEqual([0, 1, 2, 3, 0]);
    expect(homeRail(7, 1)).toBe(0);
    for (const rr of [false, true]) {
      const home = new CtrlRails(4, rr, homeRail(6, 4));
      expect([1, 2, 3, 4, 5].map(() => home.pick())).toEqual([2, 2, 2, 2, 2]);
    }
  });
});

describe('rails per device (TSNET_OFI_RAILS)', () => {
  const GiB = 2 ** 30;
  const shm: RailsHost = { provider: 'shm', nics: 1, cores: 16, ioThreads: 8, shmFree: () => 32 * GiB };
  const auto = { ...OFI_DEFAULTS, rails: 'auto' as const };

  it('by default one rail per NIC, as aws-ofi-nccl; shm is told what auto gives', () => {
    expect(OFI_DEFAULTS.rails).toBe('nics');
    const c = chooseRails(OFI_DEFAULTS, shm);
    expect([c.forceRails, c.smallRail]).toEqual([0, 'rr']);
    expect(c.line).toBe('ofi rails = one per NIC (TSNET_OFI_RAILS=nics, the default; auto gives shm 2 rails, for about 1.8x AllReduce\'s busbw at 1 GiB)');
    expect(chooseRails(OFI_DEFAULTS, { ...shm, provider: 'tcp;ofi_rxm' }).line).toBe('ofi rails = one per NIC (TSNET_OFI_RAILS=nics, the default)');
  });

  it('auto: a one-NIC shm device gets 2 rails and one small-message rail per comm', () => {
    const c = chooseRails(auto, shm);
    expect(c.forceRails).toBe(AUTO_RAILS);
    expect(AUTO_RAILS).toBe(2);
    expect(c.smallRail).toBe('comm');
    expect(c.line).toMatch(/^ofi rails = 2 on one NIC \(TSNET_OFI_RAILS=auto with shm, 16 cores, 8 I\/O threads, 32\.0 GiB free in \/dev\/shm: .*small messages' rails = one per comm \(with these rails\)$/);
  });

  it('auto: 2 rails with 2 I/O threads or more, also with 64 cores; TSNET_OFI_SMALL_RAIL kept', () => {
    expect(chooseRails(auto, { ...shm, ioThreads: 2 }).forceRails).toBe(2);
    expect(chooseRails(auto, { ...shm, ioThreads: 64, cores: 64 }).forceRails).toBe(2);
    const rr = chooseRails({ ...auto, smallRail: 'rr', smallRailSet: true }, shm);
    expect(rr.forceRails).toBe(2);
    expect(rr.smallRail).toBe('rr');
    expect(rr.line).toMatch(/small messages' rails = round-robin \(TSNET_OFI_SMALL_RAIL\)$/);
  });

  it.each([
    ['fewer cores', { cores: 15 }, /this process counts on 15 cores, fewer than 16/],
    ['one I/O thread', { ioThreads: 1 }, /1 I\/O thread/],
    ['/dev/shm unreadable', { shmFree: () => undefined }, /\/dev\/shm cannot be read/],
    ['/dev/shm short', { shmFree: () => AUTO_RAILS_MIN_SHM_FREE - 1 }, /\/dev\/shm has 2\.0 GiB free, less than 2\.0/],
  ])('auto: one rail with %s, and the line says why', (_what, over, why) => {
    const c = chooseRails(auto, { ...shm, ...over });
    expect(c.forceRails).toBe(0);
    expect(c.smallRail).toBe('rr');
    expect(c.line).toMatch(why);
    expect(c.line).toMatch(/^ofi rails = 1 \(TSNET_OFI_RAILS=auto, but .*OFI_NCCL_FORCE_NUM_RAILS=2 to 4/);
  });

  it('auto: other providers and several NICs keep one rail per NIC', () => {
    const tcp = chooseRails(auto, { ...shm, provider: 'tcp;ofi_rxm' });
    expect([tcp.forceRails, tcp.smallRail, tcp.line]).toEqual([0, 'rr', 'ofi rails = one per NIC (TSNET_OFI_RAILS=auto adds rails to one shm NIC only; this is tcp;ofi_rxm)']);
    expect(chooseRails(auto, { ...shm, nics: 2 }).forceRails).toBe(0);
  });

  it('OFI_NCCL_FORCE_NUM_RAILS is obeyed, whatever TSNET_OFI_RAILS says', () => {
    for (const rails of ['auto', 'nics'] as const) {
      const forced = chooseRails({ ...OFI_DEFAULTS, rails, forceRails: 2 }, shm);
      expect([forced.forceRails, forced.smallRail, forced.line]).toEqual([2, 'rr', null]);
    }
  });
});
