// Rail choice: how many rails a comm uses and which NIC and peer NIC carry each. A device of
// P NICs has min(P, MAX_RAILS) rails, or OFI_NCCL_FORCE_NUM_RAILS of them (fewer: a subset;
// more: NICs repeat). Both ends use the smaller of their two counts. Logical rail i runs on
// local NIC i mod P and reaches the peer's NIC i mod P'. Control messages take rail 0, or
// round-robin over the rails with OFI_NCCL_RR_CTRL_MSG, or the comm's home rail
// (TSNET_OFI_SMALL_RAIL=comm: homeRail).
import { MAX_RAILS } from '../config';

/** The rails a device of physical NICs offers. */
export function deviceRails(physical: number, force: number): number {
  const n = force > 0 ? force : physical;
  return n < MAX_RAILS ? n : MAX_RAILS;
}

/** The rails a comm uses: the smaller of both ends' counts. */
export const commRails = (mine: number, peer: number): number => (mine < peer ? mine : peer);

/** The NIC (of nics) that logical rail i runs on. */
export const nicOf = (rail: number, nics: number): number => rail % nics;

/**
 * A comm's home rail with TSNET_OFI_SMALL_RAIL=comm: both ends compute it from the sending
 * comm's id, so the sender's small messages and the receiver's control messages meet on it.
 */
export const homeRail = (sendCommId: number, rails: number): number => sendCommId % rails;

/** Picks control-message rails: always 0, round-robin over rails, or always home (>= 0). */
export class CtrlRails {
  private next = 0;

  constructor(
    private readonly rails: number,
    private readonly roundRobin: boolean,
    private readonly home = -1,
  ) {}

  pick(): number {
    if (this.home >= 0) return this.home;
    if (!this.roundRobin) return 0;
    const r = this.next;
    this.next = r + 1 === this.rails ? 0 : r + 1;
    return r;
  }
}
