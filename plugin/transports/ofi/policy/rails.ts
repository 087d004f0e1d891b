// Rail choice: how many rails a comm uses and which NIC and peer NIC carry each. A device of
// P NICs has min(P, MAX_RAILS) rails, or OFI_NCCL_FORCE_NUM_RAILS of them (fewer: a subset;
// more: NICs repeat). Both ends use the smaller of their two counts. Logical rail i runs on
// local NIC i mod P and reaches the peer's NIC i mod P'. Control messages take rail 0, or
// round-robin over the rails with OFI_NCCL_RR_CTRL_MSG, or the comm's home rail
// (TSNET_OFI_SMALL_RAIL=comm: homeRail).
import { MAX_RAILS, type OfiConfig, type SmallRail } from '../config';

/** Cores this process counts on (config.ts, coreShare) below which TSNET_OFI_RAILS=auto keeps one rail. */
export const AUTO_RAILS_MIN_CORES = 16;
/**
 * Rails TSNET_OFI_RAILS=auto gives a one-NIC shm device. 4 ranks on 4 x H200 (64 cores, one
 * lease): 2 rails moved AllReduce 1 GiB at 1.70-1.99x one rail's busbw (6 rounds of 6) and
 * AllToAll at 1.11-1.18x; small operations took the same time in nccl-tests' sweeps but up to
 * 2.4x one rail's median at 2-32 KiB in runs of 200 iterations. 4 rails used twice the CPU,
 * the hypervisor took 20-41 CPU-seconds a run, and small operations took milliseconds
 * (docs/performance.md, item 31). So one rail per NIC stays the default.
 */
export const AUTO_RAILS = 2;
/** Free bytes of /dev/shm below which TSNET_OFI_RAILS=auto keeps one rail (each endpoint of shm is a 16 MiB region there). */
export const AUTO_RAILS_MIN_SHM_FREE = 2 * 2 ** 30;

/** What the rails' choice looks at. */
export interface RailsHost {
  /** The provider of the NICs. */
  provider: string;
  /** NICs libfabric listed (shm lists one). */
  nics: number;
  /** Cores this process counts on. */
  cores: number;
  /** The process's I/O threads: each rail's endpoint is on one. */
  ioThreads: number;
  /** Free bytes in /dev/shm; undefined where it cannot be read. Asked only where auto may add rails. */
  shmFree: () => number | undefined;
}

/** The rails' settings a transport uses, and the INFO line that says why (null: the config's own lines said it). */
export interface RailsChoice {
  forceRails: number;
  smallRail: SmallRail;
  line: string | null;
}

const gib = (b: number): string => (b / 2 ** 30).toFixed(1);

/**
 * Rails for the devices (TSNET_OFI_RAILS). 'nics' (the default): one per NIC, as aws-ofi-nccl.
 * 'auto': shm moves a remote write's bytes inside the target endpoint's completion-queue poll,
 * so one endpoint copies on one I/O thread; auto gives a one-NIC shm device AUTO_RAILS rails
 * (one I/O thread each), small messages one rail per comm (unless TSNET_OFI_SMALL_RAIL says), where
 * this process counts on AUTO_RAILS_MIN_CORES cores and /dev/shm has AUTO_RAILS_MIN_SHM_FREE
 * free; other providers keep one rail per NIC (over libfabric tcp, 4 rails doubled the CPU and
 * made small operations take milliseconds in the same lease). OFI_NCCL_FORCE_NUM_RAILS overrides
 * both.
 */
export function chooseRails(c: Pick<OfiConfig, 'forceRails' | 'rails' | 'smallRail' | 'smallRailSet'>, h: RailsHost): RailsChoice {
  const keep = (line: string | null): RailsChoice => ({ forceRails: c.forceRails, smallRail: c.smallRail, line });
  if (c.forceRails > 0) return keep(null);
  if (c.rails === 'nics') {
    const hint = h.provider === 'shm' && h.nics === 1 ? `; auto gives shm ${AUTO_RAILS} rails, for about 1.8x AllReduce's busbw at 1 GiB` : '';
    return keep(`ofi rails = one per NIC (TSNET_OFI_RAILS=nics, the default${hint})`);
  }
  if (h.provider !== 'shm' || h.nics !== 1) return keep(`ofi rails = one per NIC (TSNET_OFI_RAILS=auto adds rails to one shm NIC only; this is ${h.provider})`);
  const more = `OFI_NCCL_FORCE_NUM_RAILS=2 to ${MAX_RAILS} gives the device that many endpoints, each on its own I/O thread`;
  const free = h.cores >= AUTO_RAILS_MIN_CORES && h.ioThreads >= AUTO_RAILS ? h.shmFree() : undefined;
  let why = '';
  if (h.cores < AUTO_RAILS_MIN_CORES) why = `this process counts on ${h.cores} cores, fewer than ${AUTO_RAILS_MIN_CORES}`;
  else if (h.ioThreads < AUTO_RAILS) why = `${h.ioThreads} I/O thread`;
  else if (free === undefined) why = '/dev/shm cannot be read';
  else if (free < AUTO_RAILS_MIN_SHM_FREE) why = `/dev/shm has ${gib(free)} GiB free, less than ${gib(AUTO_RAILS_MIN_SHM_FREE)}`;
  if (why) return keep(`ofi rails = 1 (TSNET_OFI_RAILS=auto, but ${why}; ${more})`);
  const rails = AUTO_RAILS; // one I/O thread each: the process has that many (checked above)
  const smallRail: SmallRail = c.smallRailSet ? c.smallRail : 'comm';
  return {
    forceRails: rails,
    smallRail,
    line:
      `ofi rails = ${rails} on one NIC (TSNET_OFI_RAILS=auto with shm, ${h.cores} cores, ${h.ioThreads} I/O threads, ${gib(free!)} GiB free in /dev/shm: ` +
      `each rail an endpoint with its own I/O thread and /dev/shm region, so large messages are copied on ${rails} threads; OFI_NCCL_FORCE_NUM_RAILS sets up to ${MAX_RAILS}), ` +
      `small messages' rails = ${smallRail === 'comm' ? 'one per comm' : 'round-robin'} (${c.smallRailSet ? 'TSNET_OFI_SMALL_RAIL' : 'with these rails'})`,
  };
}

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
