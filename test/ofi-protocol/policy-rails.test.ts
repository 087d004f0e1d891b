// Rail choice: rails per device (OFI_NCCL_FORCE_NUM_RAILS subsets or repeats NICs, at most 4),
// both ends agree on the smaller count, rail i runs on NIC i mod NICs, control messages on
// rail 0 or round-robin.
import { describe, expect, it } from 'vitest';
import { CtrlRails, commRails, deviceRails, homeRail, nicOf } from '../../plugin/transports/ofi/policy/rails';

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
