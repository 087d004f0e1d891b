// Configuration: environment variables, read once at the first init, validated (a bad value
// is an error naming the variable) and logged at INFO. TSNET_* are the plugin's own; NCCL's
// socket variables and aws-ofi-nccl's OFI_NCCL_* are honoured where they mean the same.
import * as os from 'node:os';
import { invalidArgument } from './errors';
import { LIMITS } from './protocol/link';
import { type OfiConfig, readOfiConfig } from './transports/ofi/config';
import {
  EAGER_POLICIES, type EagerPolicy, LANE_POLICIES, type LanePolicy, STRIPE_POLICIES, type StripePolicy, byName,
} from './protocol/policies';

/** TSNET_SPIN_MAX_US where the busy-poll window is on and TSNET_SPIN_MAX_US is not set. */
export const SPIN_MAX_DEFAULT_US = 5000;

export type TransportName = 'tcp' | 'ofi' | 'loopback';

export interface Config {
  /** Which transport carries the bytes. */
  transport: TransportName;
  /** Number of loopback devices (loopback transport only). */
  loopbackDevices: number;
  /** Data sockets per comm (at least 1: the control lane carries frames and eager payloads only). */
  nsocks: number;
  /** Messages up to this size travel inline with their header. */
  eagerMax: number;
  /** Smallest stripe a large message is cut into. */
  minStripe: number;
  /** Interfaces to use, NCCL's syntax (prefix list, ^ excludes, = exact). */
  socketIfname: string | undefined;
  /** Address family to use: 4, 6 or undefined for either. */
  socketFamily: 4 | 6 | undefined;
  /** Interfaces joined into one device: `a+b,c` (TSNET_DEVICE_GROUPS). */
  deviceGroups: string | undefined;
  /** Cores this process counts on (its CPU set, or its share of the host among its ranks). */
  cores: number;
  /** Native I/O threads in the process. */
  ioThreads: number;
  /** Threads that run the protocol (JavaScript), each with a share of the comms. */
  protocolThreads: number;
  /** Protocol policies (plugin/protocol/policies/). */
  eagerPolicy: EagerPolicy;
  stripePolicy: StripePolicy;
  lanePolicy: LanePolicy;
  /** TSNET_TRACE: a Chrome/Perfetto trace of every request goes to this file (%p: the pid). */
  traceFile: string | undefined;
  /**
   * TSNET_STALL_STACKS: when an I/O thread has sat inside one provider call past half the link
   * timeout, every thread's stack of the process goes to this file, once (%p: the pid;
   * native/stacks.h). A diagnostic; tsnet's threads then leave one real-time signal unblocked.
   */
  stallStacks: string | undefined;
  /** TSNET_STATS: per comm and per thread figures at close. */
  stats: boolean;
  /** TSNET_STATS=steps: also where requests spend their time between threads (plugin/steps.ts). */
  statsSteps: boolean;
  /** µs the plugin thread keeps polling after activity before it sleeps (0: never spins). */
  spinUs: number;
  /**
   * TSNET_SPIN_MAX_US: the busy-poll window may grow up to this when sleeping threads wake late
   * (plugin/spin.ts); 0 (the default): it stays spinUs.
   */
  spinMaxUs: number;
  /**
   * µs an I/O thread sleeps between polls of an endpoint without a wait fd (libfabric's shm)
   * in the first ms after activity, when it does not busy-poll (TSNET_OFI_POLL_US).
   */
  pollUs: number;
  /**
   * TSNET_DIRECT_SEND_MAX: payload bytes up to which a protocol thread writes a frame to its TCP
   * control lane itself when nothing of it waits for the lane's I/O thread (-1: never).
   */
  directSendMax: number;
  /** TSNET_DIRECT_SEND_IDLE_US: only a lane that wrote nothing for this long is written here; 0: any lane. */
  directIdleUs: number;
  /**
   * TSNET_EARLY_WAKE: while a protocol thread sleeps, its lanes' sockets and doorbells wake it
   * together with the I/O thread that reads them (native/engine/engine_js.cc, early wake-ups);
   * only where it has a busy-poll window to open. Off by default.
   */
  earlyWake: boolean;
  /**
   * TSNET_CONNECT_EARLY: a TCP connect gives NCCL its comm once its sockets are connected and
   * greeted, without waiting for the listener's ACKs (sends wait for them: transports/early.ts).
   */
  connectEarly: boolean;
  /** Seconds without progress on a link with work pending before it is declared dead. */
  timeoutSec: number;
  /** The libfabric transport's settings (OFI_NCCL_*, TSNET_FLUSH), when it is chosen. */
  ofi: OfiConfig | undefined;
  /** µs NCCL adds to its latency estimate of a device (OFI_NCCL_NET_LATENCY). */
  latencyUs: number;
  /**
   * Messages the first init sends to itself on each protocol thread before it returns, so
   * that V8 has compiled the data path before NCCL's first operation (0: none).
   */
  warmup: number;
}

type Env = Record<string, string | undefined>;

/** TSNET_WARMUP's default: messages per protocol thread at the first init. */
export const WARMUP_DEFAULT = 10000;

interface Source {
  name: string;
  value: string;
}

/** The first variable of names that is set (and not empty). */
function pick(env: Env, names: string[]): Source | undefined {
  for (const name of names) {
    const value = env[name];
    if (value !== undefined && value !== '') return { name, value };
  }
  return undefined;
}

function int(src: Source, min: number, max: number): number {
  const v = src.value.trim();
  if (!/^-?\d+$/.test(v)) throw invalidArgument(`${src.name}=${src.value}: expected an integer`);
  const n = Number(v);
  if (n < min || n > max) throw invalidArgument(`${src.name}=${src.value}: expected ${min} to ${max}`);
  return n;
}

function flag(src: Source): boolean {
  const v = src.value.trim().toLowerCase();
  if (v === '1' || v === 'true' || v === 'yes') return true;
  if (v === '0' || v === 'false' || v === 'no') return false;
  throw invalidArgument(`${src.name}=${src.value}: expected 0 or 1`);
}

const KiB = 1024;
const MiB = 1024 * KiB;

/** The host's cores, and those this process may run on (its CPU affinity). */
export interface HostCores {
  total: number;
  available: number;
}

export function hostCores(): HostCores {
  const total = os.cpus().length || 1;
  const available = typeof os.availableParallelism === 'function' ? os.availableParallelism() : total;
  return { total, available: Math.max(1, Math.min(available, total)) };
}

/** Variables in which launchers say how many ranks run on this host (torchrun, Open MPI, MPICH, Slurm). */
const LOCAL_RANKS = ['LOCAL_WORLD_SIZE', 'OMPI_COMM_WORLD_LOCAL_SIZE', 'MPI_LOCALNRANKS', 'SLURM_NTASKS_PER_NODE'];

/**
 * The cores the thread defaults count on: the CPU set a launcher bound this process to, else
 * an equal share of the host among the ranks a launcher says run on it, else the host's. Four
 * ranks on 16 cores, each with the defaults of a 16-core process, ran AllReduce at a quarter of
 * the speed they reached with their threads cut (docs/performance.md).
 */
function coreShare(env: Env, host: HostCores): { cores: number; line?: string } {
  if (host.available < host.total) return { cores: host.available, line: `cores for this process = ${host.available} (its CPU affinity, of ${host.total})` };
  for (const name of LOCAL_RANKS) {
    const m = /^\s*(\d+)/.exec(env[name] ?? ''); // Slurm may write "4(x2)"
    const ranks = m ? Number(m[1]) : 0;
    if (ranks > 1) {
      const cores = Math.max(1, Math.floor(host.total / ranks));
      return { cores, line: `cores for this process = ${cores} (${host.total} cores, ${ranks} ranks on this host: ${name})` };
    }
    if (ranks === 1) break;
  }
  return { cores: host.total };
}

/** host: the cores (a number stands for a host whose every core this process may use). */
export function readConfig(env: Env = process.env, host: HostCores | number = hostCores()): { config: Config; lines: string[] } {
  const lines: string[] = [];
  const note = (key: string, value: unknown, src?: Source) =>
    lines.push(`${key} = ${value}${src ? ` (${src.name})` : ' (default)'}`);
  const hc = typeof host === 'number' ? { total: host, available: host } : host;
  const share = coreShare(env, hc);
  const cores = share.cores;

  const tSrc = pick(env, ['TSNET_TRANSPORT']);
  const transport = (tSrc?.value ?? 'tcp').toLowerCase();
  if (transport !== 'tcp' && transport !== 'ofi' && transport !== 'loopback')
    throw invalidArgument(`TSNET_TRANSPORT=${tSrc?.value}: expected tcp, ofi or loopback`);
  note('transport', transport, tSrc);

  const lSrc = pick(env, ['TSNET_LOOPBACK_DEVICES']);
  const loopbackDevices = lSrc ? int(lSrc, 1, 64) : 1;
  if (transport === 'loopback') note('loopback devices', loopbackDevices, lSrc);

  // Data sockets: TSNET_NSOCKS, else NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD when set.
  const nSrc = pick(env, ['TSNET_NSOCKS']);
  let nsocks = 4;
  let nsocksSrc: Source | undefined = nSrc;
  if (nSrc) nsocks = int(nSrc, 1, LIMITS.lanes);
  else {
    const th = pick(env, ['NCCL_SOCKET_NTHREADS']);
    const per = pick(env, ['NCCL_NSOCKS_PERTHREAD']);
    if (th || per) {
      const threads = th ? int(th, 1, 16) : 1;
      const socks = per ? int(per, 1, LIMITS.lanes) : 1;
      if (threads * socks > LIMITS.lanes)
        throw invalidArgument(`NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = ${threads * socks}: at most ${LIMITS.lanes}`);
      nsocks = threads * socks;
      nsocksSrc = { name: [th?.name, per?.name].filter(Boolean).join(' x '), value: String(nsocks) };
    }
  }
  note('data sockets per comm', nsocks, nsocksSrc);

  // The stream transports' eager limit; the libfabric transport reads OFI_NCCL_EAGER_MAX_SIZE
  // itself (ofi/config.ts: -1 disables eager there).
  const eSrc = pick(env, transport === 'ofi' ? ['TSNET_EAGER_MAX'] : ['TSNET_EAGER_MAX', 'OFI_NCCL_EAGER_MAX_SIZE']);
  // 64 KiB covers NCCL's LL messages: they ride the control lane, no I/O-thread hop.
  let eagerMax = eSrc ? int(eSrc, -1, LIMITS.eagerMax) : 64 * KiB;
  if (eagerMax < 0) eagerMax = 0; // aws-ofi-nccl's "-1 disables": only empty messages go inline
  if (transport !== 'ofi') note('eager max bytes', eagerMax, eSrc);

  const sSrc = pick(env, ['TSNET_MIN_STRIPE']);
  const minStripe = sSrc ? int(sSrc, LIMITS.minStripe, LIMITS.maxStripe) : 128 * KiB;
  if (minStripe % (4 * KiB)) throw invalidArgument(`${sSrc!.name}=${sSrc!.value}: expected a multiple of 4096`);
  note('min stripe bytes', minStripe, sSrc);

  const iSrc = pick(env, ['NCCL_SOCKET_IFNAME']);
  if (iSrc) note('interfaces', iSrc.value, iSrc);

  const fSrc = pick(env, ['NCCL_SOCKET_FAMILY']);
  let socketFamily: 4 | 6 | undefined;
  if (fSrc) {
    const f = fSrc.value.toUpperCase();
    if (f === 'AF_INET' || f === '4') socketFamily = 4;
    else if (f === 'AF_INET6' || f === '6') socketFamily = 6;
    else throw invalidArgument(`NCCL_SOCKET_FAMILY=${fSrc.value}: expected AF_INET or AF_INET6`);
    note('address family', f, fSrc);
  }

  const gSrc = pick(env, ['TSNET_DEVICE_GROUPS']);
  if (gSrc) note('device groups', gSrc.value, gSrc);

  // The defaults below follow the cores this process may count on (coreShare).
  if (share.line && transport !== 'loopback') lines.push(share.line);
  const itSrc = pick(env, ['TSNET_IO_THREADS']);
  // 8 for a process that has the host (or its CPU set) to itself; fewer for a share of it.
  const ioThreads = itSrc ? int(itSrc, 1, 64) : cores < hc.total ? Math.min(8, Math.max(2, cores)) : 8;
  if (transport !== 'loopback') note('I/O threads', ioThreads, itSrc);

  // One protocol thread handles some 300,000 messages a second; AllToAll over several ranks
  // in one process needs more (docs/performance.md). Loopback links join two comms of one
  // thread, so loopback has one.
  const ptSrc = pick(env, ['TSNET_PROTOCOL_THREADS']);
  let protocolThreads = ptSrc ? int(ptSrc, 1, 16) : cores >= 32 ? 4 : cores >= 16 ? 2 : 1;
  if (transport === 'loopback' && protocolThreads > 1) {
    if (ptSrc) lines.push(`protocol threads = 1 (${ptSrc.name}=${ptSrc.value} ignored: loopback links live in one thread)`);
    else note('protocol threads', 1);
    protocolThreads = 1;
  } else note('protocol threads', protocolThreads, ptSrc);

  const policy = <P extends { name: string }>(name: string, list: readonly P[]): P => {
    const src = pick(env, [name]);
    const p = byName(list, src?.value ?? list[0].name);
    if (!p) throw invalidArgument(`${name}=${src!.value}: expected ${list.map((x) => x.name).join(' or ')}`);
    if (src) note(name.slice(6).toLowerCase().replace('_', ' '), p.name, src);
    return p;
  };
  const eagerPolicy = policy('TSNET_EAGER_POLICY', EAGER_POLICIES);
  const stripePolicy = policy('TSNET_STRIPE_POLICY', STRIPE_POLICIES);
  const lanePolicy = policy('TSNET_LANE_POLICY', LANE_POLICIES);

  const trSrc = pick(env, ['TSNET_TRACE']);
  const traceFile = trSrc?.value.replace(/%p/g, String(process.pid));
  if (trSrc) note('trace file', traceFile, trSrc);
  const ssSrc = pick(env, ['TSNET_STALL_STACKS']);
  const stallStacks = ssSrc?.value.replace(/%p/g, String(process.pid));
  if (ssSrc) note('thread stacks at a stalled provider call', stallStacks, ssSrc);
  const stSrc = pick(env, ['TSNET_STATS']);
  const stValue = stSrc?.value.toLowerCase();
  if (stSrc && stValue !== '0' && stValue !== '1' && stValue !== 'steps') throw invalidArgument(`${stSrc.name}=${stSrc.value}: expected 0, 1 or steps`);
  const statsSteps = stValue === 'steps';
  const stats = stValue === '1' || statsSteps;
  if (stSrc) note('statistics', statsSteps ? 'on, with the steps of requests' : stats ? 'on' : 'off', stSrc);

  const spSrc = pick(env, ['TSNET_SPIN_US']);
  // Polling pays on machines with cores to spare (H200 host, 32 cores: 32 KiB latency 124 us
  // without, 53 us with 200 us); on a small one it steals the CPU the threads doing the work
  // need (2 cores: 8-byte latency 43 us without, 135 us with).
  const spinUs = spSrc ? int(spSrc, 0, 1_000_000) : cores >= 8 ? 200 : 0;
  note('busy-poll window us', spinUs, spSrc);
  const smSrc = pick(env, ['TSNET_SPIN_MAX_US']);
  // Where sleeping threads wake late (a VM that parks idle vCPUs), windows that run out make
  // every later message pay wake-ups; windows that follow the delays held 1 GiB AllReduce over
  // TCP at 6.50-9.21 GB/s where fixed ones gave 4.74-8.95 (4 x H200, one lease, five pairs
  // alternating). Where wake-ups are fast the window stays at TSNET_SPIN_US.
  const spinMaxUs = smSrc ? int(smSrc, 0, 1_000_000) : spinUs > 0 && spinUs < SPIN_MAX_DEFAULT_US ? SPIN_MAX_DEFAULT_US : 0;
  if (smSrc && spinMaxUs > 0 && (spinUs === 0 || spinMaxUs <= spinUs))
    throw invalidArgument(`${smSrc.name}=${smSrc.value}: expected 0, or more than the busy-poll window (${spinUs} us; a window of 0 never spins, so it cannot grow)`);
  if (smSrc || spinMaxUs > 0) note('busy-poll window grows with late wake-ups up to us', spinMaxUs || 'off', smSrc);
  const poSrc = pick(env, ['TSNET_OFI_POLL_US']);
  // Shorter polls cut latency without a busy-poll window and cost CPU (H200, two processes,
  // 8-byte ping-pong: 50 us 72 us latency, 20 us 48 us and +25% CPU, 10 us 40 us and +44%).
  const pollUs = poSrc ? int(poSrc, 1, 1000) : 50;
  if (transport === 'ofi' || poSrc) note('poll interval us of endpoints without a wait fd', pollUs, poSrc);
  const dsSrc = pick(env, ['TSNET_DIRECT_SEND_MAX']);
  // A small frame written on the protocol thread skips a hand-over to the I/O thread per message
  // (docs/performance.md); larger ones would hold the thread's turn for their copy. Over
  // libfabric the same limit applies to sends and writes with immediate data the protocol
  // thread injects itself (within the provider's inject size), off unless set: it made nothing
  // faster, and a provider call that never returns (shm spinning on the lock of a killed peer)
  // then stops the protocol thread, whose watchdog would otherwise fail the comms (item 21).
  const directSendMax = dsSrc ? int(dsSrc, -1, LIMITS.eagerMax) : transport === 'ofi' ? -1 : 8192;
  const dsValue = directSendMax < 0 ? 'off' : directSendMax;
  if (transport === 'tcp' || (dsSrc && transport !== 'ofi')) note('frames written by the protocol thread up to bytes', dsValue, dsSrc);
  if (transport === 'ofi') note('sends and writes the protocol thread injects itself up to bytes', dsValue, dsSrc);
  const diSrc = pick(env, ['TSNET_DIRECT_SEND_IDLE_US']);
  // A lane that wrote a moment ago carries a stream, whose frames the I/O thread could gather
  // into fewer calls while the protocol thread makes none of them. Off by default: one comm
  // pair streaming 8-byte messages lost 20% of its rate to the protocol thread's writes in one
  // lease and nothing in two others, and 5 us changed no NCCL figure (performance.md item 21).
  const directIdleUs = diSrc ? int(diSrc, 0, 1000) : 0;
  if (diSrc) note('written by the protocol thread only on a lane idle for us', directIdleUs || 'any', diSrc);

  const ewSrc = pick(env, ['TSNET_EARLY_WAKE']);
  // Off by default: it took 6-21% off tsnet over TCP's latency after 20 ms idle (2 and 4 H100s,
  // interleaved), but small AllReduce over TCP took longer with it at 8-32 B in all five rounds
  // (4 ranks: 8 B 106-533 us against 77-86), not explained; over shm the I/O thread usually
  // drains the doorbell before the protocol thread's wake-up looks at it (performance.md, item 35).
  const earlyWake = ewSrc ? flag(ewSrc) : false;
  if (ewSrc) note('protocol threads woken with their I/O threads', earlyWake ? (spinUs > 0 ? 'on' : 'on, but no busy-poll window to open') : 'off', ewSrc);

  const ceSrc = pick(env, ['TSNET_CONNECT_EARLY']);
  // Off by default: it took NCCL's connect calls from about three per comm to one, but 48
  // communicators of 32 channels under PyTorch came up no sooner (performance.md, item 44).
  const connectEarly = ceSrc ? flag(ceSrc) : false;
  if (ceSrc) note('TCP connects give their comm before the ACKs', connectEarly ? 'on' : 'off', ceSrc);

  let ofi: OfiConfig | undefined;
  let latencyUs = 0;
  if (transport === 'ofi') {
    const o = readOfiConfig(env);
    ofi = o.config;
    lines.push(...o.lines);
    const latSrc = pick(env, ['OFI_NCCL_NET_LATENCY']);
    if (latSrc) {
      latencyUs = Number(latSrc.value);
      if (!Number.isFinite(latencyUs) || latencyUs < 0) throw invalidArgument(`${latSrc.name}=${latSrc.value}: expected a number of microseconds >= 0`);
      note('latency us', latencyUs, latSrc);
    }
  }

  const toSrc = pick(env, ['TSNET_TIMEOUT_SEC']);
  const timeoutSec = toSrc ? int(toSrc, 1, 3600) : 10;
  note('link timeout seconds', timeoutSec, toSrc);

  const wuSrc = pick(env, ['TSNET_WARMUP']);
  // Two H200s, nccl-tests' default warm-up, AllReduce 8 B to 128 B over libfabric shm against
  // Socket: 3.8-9.5x without (1 run), 1.7-2.3x with 3000 (median of 6), 1.1-1.7x with 10000
  // (median of 3), which costs about 0.3-0.5 s of init there (docs/performance.md, item 14).
  const warmup = wuSrc ? int(wuSrc, 0, 100_000) : WARMUP_DEFAULT;
  note('warm-up messages at init', warmup, wuSrc);

  return {
    config: {
      transport: transport as TransportName,
      loopbackDevices,
      nsocks,
      eagerMax,
      minStripe,
      socketIfname: iSrc?.value,
      socketFamily,
      deviceGroups: gSrc?.value,
      cores,
      ioThreads,
      protocolThreads,
      eagerPolicy,
      stripePolicy,
      lanePolicy,
      traceFile,
      stallStacks,
      stats,
      statsSteps,
      spinUs,
      spinMaxUs,
      pollUs,
      directSendMax,
      directIdleUs,
      earlyWake,
      connectEarly,
      timeoutSec,
      ofi,
      latencyUs,
      warmup,
    },
    lines,
  };
}
