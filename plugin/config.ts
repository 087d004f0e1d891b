// Configuration: environment variables, read once at the first init, validated (a bad value
// is an error naming the variable) and logged at INFO. TSNET_* are the plugin's own; NCCL's
// socket variables and aws-ofi-nccl's OFI_NCCL_* are honoured where they mean the same.
import * as os from 'node:os';
import { invalidArgument } from './errors';

export type TransportName = 'tcp' | 'loopback';

export interface Config {
  /** Which transport carries the bytes. */
  transport: TransportName;
  /** Number of loopback devices (loopback transport only). */
  loopbackDevices: number;
  /** Data sockets per comm; 0 puts every byte on the control stream. */
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
  /** Who moves socket bytes: native I/O threads, or the plugin thread through Node sockets. */
  io: 'native' | 'node';
  /** Native I/O threads in the process. */
  ioThreads: number;
  /** µs the plugin thread keeps polling after activity before it sleeps (0: never spins). */
  spinUs: number;
  /** Seconds without progress on a link with work pending before it is declared dead. */
  timeoutSec: number;
}

type Env = Record<string, string | undefined>;

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

const KiB = 1024;
const MiB = 1024 * KiB;

export function readConfig(env: Env = process.env, cores = os.cpus().length): { config: Config; lines: string[] } {
  const lines: string[] = [];
  const note = (key: string, value: unknown, src?: Source) =>
    lines.push(`${key} = ${value}${src ? ` (${src.name})` : ' (default)'}`);

  const tSrc = pick(env, ['TSNET_TRANSPORT']);
  const transport = (tSrc?.value ?? 'tcp').toLowerCase();
  if (transport !== 'tcp' && transport !== 'loopback')
    throw invalidArgument(`TSNET_TRANSPORT=${tSrc?.value}: expected tcp or loopback`);
  note('transport', transport, tSrc);

  const lSrc = pick(env, ['TSNET_LOOPBACK_DEVICES']);
  const loopbackDevices = lSrc ? int(lSrc, 1, 64) : 1;
  if (transport === 'loopback') note('loopback devices', loopbackDevices, lSrc);

  // Data sockets: TSNET_NSOCKS, else NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD when set.
  const nSrc = pick(env, ['TSNET_NSOCKS']);
  let nsocks = 4;
  let nsocksSrc: Source | undefined = nSrc;
  if (nSrc) nsocks = int(nSrc, 0, 64);
  else {
    const th = pick(env, ['NCCL_SOCKET_NTHREADS']);
    const per = pick(env, ['NCCL_NSOCKS_PERTHREAD']);
    if (th || per) {
      const threads = th ? int(th, 1, 16) : 1;
      const socks = per ? int(per, 1, 64) : 1;
      if (threads * socks > 64)
        throw invalidArgument(`NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = ${threads * socks}: at most 64`);
      nsocks = threads * socks;
      nsocksSrc = { name: [th?.name, per?.name].filter(Boolean).join(' x '), value: String(nsocks) };
    }
  }
  note('data sockets per comm', nsocks, nsocksSrc);

  const eSrc = pick(env, ['TSNET_EAGER_MAX', 'OFI_NCCL_EAGER_MAX_SIZE']);
  // 64 KiB covers NCCL's LL messages: they ride the control lane, no I/O-thread hop.
  const eagerMax = eSrc ? int(eSrc, 0, 1 * MiB) : 64 * KiB;
  note('eager max bytes', eagerMax, eSrc);

  const sSrc = pick(env, ['TSNET_MIN_STRIPE']);
  const minStripe = sSrc ? int(sSrc, 4 * KiB, 64 * MiB) : 128 * KiB;
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

  const ioSrc = pick(env, ['TSNET_IO']);
  const io = (ioSrc?.value ?? 'native').toLowerCase();
  if (io !== 'native' && io !== 'node') throw invalidArgument(`TSNET_IO=${ioSrc?.value}: expected native or node`);
  if (transport === 'tcp') note('socket I/O', io, ioSrc);
  const itSrc = pick(env, ['TSNET_IO_THREADS']);
  const ioThreads = itSrc ? int(itSrc, 1, 64) : 8;
  if (transport === 'tcp' && io === 'native') note('I/O threads', ioThreads, itSrc);

  const spSrc = pick(env, ['TSNET_SPIN_US']);
  // Polling pays on machines with cores to spare (H200 host, 32 cores: 32 KiB latency 124 us
  // without, 53 us with 200 us); on a small one it steals the CPU the threads doing the work
  // need (2 cores: 8-byte latency 43 us without, 135 us with).
  const spinUs = spSrc ? int(spSrc, 0, 1_000_000) : cores >= 8 ? 200 : 0;
  note('busy-poll window us', spinUs, spSrc);

  const toSrc = pick(env, ['TSNET_TIMEOUT_SEC']);
  const timeoutSec = toSrc ? int(toSrc, 1, 3600) : 10;
  note('link timeout seconds', timeoutSec, toSrc);

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
      io: io as 'native' | 'node',
      ioThreads,
      spinUs,
      timeoutSec,
    },
    lines,
  };
}
