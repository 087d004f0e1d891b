// Command-line options of the loopback benchmark (`npm start -- --help`).

export type OfiProvider = 'tcp' | 'shm';
export const OFI_PROVIDERS: readonly OfiProvider[] = ['tcp', 'shm'];

export interface Options {
  sizes: number[]; // message sizes, bytes
  duration: number; // measured seconds per measurement
  warmup: number; // seconds before each measurement that are not counted
  repeats: number; // measurements per size and series
  streams: number; // tsnet's TSNET_NSOCKS and the sockets of the tcp-N baseline
  version: number; // ncclNet table version driven
  out: string; // folder of bench.json and bench.svg
  timeout: number; // seconds any one wait of the bench binary may take
  quick: boolean;
  lib: string; // the plugin
  rateSizes: number[]; // message sizes of the message-rate phase (empty: no rate phase)
  ratePairs: number[]; // comm pairs (tsnet) and streams (TCP) of the message-rate phase
  inflight: number; // messages in flight per comm in the message-rate phase
  ofi: OfiProvider[]; // libfabric providers to run tsnet over (TSNET_TRANSPORT=ofi)
  ofiExplicit: boolean; // --ofi was given: a missing libfabric is an error, not a note
}

export const DEFAULT_SIZES = [8, 64, 512, 4096, 32768, 262144, 1 << 20, 4 << 20, 16 << 20, 64 << 20];
export const QUICK_SIZES = [8, 1 << 20];
export const DEFAULT_RATE_SIZES = [8, 4096, 128 << 10];
export const QUICK_RATE_SIZES = [8];
export const DEFAULT_RATE_PAIRS = [1, 4];
export const DEFAULT_REPEATS = 3;
export const BW_INFLIGHT = 8; // the bandwidth series' isends / irecvs in flight (bench.c's default)

export const USAGE = `usage: npm start -- [options]        (or: node dist/bench/main.js [options])

Runs tsnet (build/libnccl-net-tsnet.so, two processes over loopback) against plain C TCP
sockets (one stream, and --streams streams), interleaved, over tsnet's TCP transport and over
libfabric (TSNET_TRANSPORT=ofi), then the message rate; writes bench.json, bench.svg and
bench-rate.svg.

  --sizes LIST       message sizes, e.g. 8,64,4K,1M,64M (default: powers of 8 from 8 B to 64 MiB, and 1 MiB)
  --duration S       measured seconds per measurement (default 1)
  --warmup S         seconds of warm-up per measurement, not counted (default 0.2)
  --repeats N        measurements per size and series (default ${DEFAULT_REPEATS})
  --streams N        tsnet's data sockets (TSNET_NSOCKS) and the TCP baseline's streams
                     (default: TSNET_NSOCKS, or 4)
  --ofi LIST         libfabric providers to run tsnet over: tcp,shm | tcp | shm | none
                     (default tcp,shm when libfabric.so.1 is found, else none with a note;
                     given explicitly, a missing libfabric is an error)
  --rate-sizes LIST  message sizes of the message-rate table, or none (default 8,4K,128K)
  --rate-pairs LIST  comm pairs (and TCP streams) of the message-rate table (default 1,4)
  --inflight K       messages in flight per comm in the message-rate table, 1..32 (default 32)
  --version V        ncclNet table version to drive, 6..12 (default 12)
  --out DIR          where bench.json and the SVGs go (default bench-results)
  --timeout S        longest any one wait may take (default 30)
  --quick            sizes 8 and 1M, rate size 8, 1 repeat, 0.1 s: a smoke test of the whole pipeline
  --help             this text
`;

/** "64", "4K", "1M", "2G" (binary units) -> bytes. */
export function parseSize(text: string): number {
  const m = /^(\d+)([kKmMgG]?)(i?[bB])?$/.exec(text.trim());
  if (!m) throw new Error(`bad size '${text}'`);
  const unit = { '': 1, k: 1024, m: 1 << 20, g: 1 << 30 }[m[2].toLowerCase() as '' | 'k' | 'm' | 'g'];
  const n = Number(m[1]) * unit;
  if (n < 1 || n > 1 << 30) throw new Error(`size '${text}' is outside 1 B .. 1 GiB`);
  return n;
}

/** A comma-separated list of sizes; "none" gives [] where allowed. */
function sizeList(flag: string, text: string, noneOk: boolean): number[] {
  if (noneOk && text.trim() === 'none') return [];
  const sizes = text.split(',').filter((s) => s.trim() !== '').map(parseSize);
  if (sizes.length === 0) throw new Error(`${flag} needs at least one size${noneOk ? ' (or none)' : ''}`);
  return sizes;
}

function positive(name: string, text: string | undefined, integer: boolean): number {
  const n = Number(text);
  if (text === undefined || !Number.isFinite(n) || n <= 0 || (integer && !Number.isInteger(n)))
    throw new Error(`${name} needs a positive ${integer ? 'integer' : 'number'}, got '${text ?? ''}'`);
  return n;
}

/** Parses argv (without node and the script); throws Error with a message on bad input. */
export function parseOptions(argv: string[], env: NodeJS.ProcessEnv): Options | 'help' {
  const nsocks = env.TSNET_NSOCKS ? positive('TSNET_NSOCKS', env.TSNET_NSOCKS, true) : 4;
  const o: Options = {
    sizes: DEFAULT_SIZES,
    duration: 1,
    warmup: 0.2,
    repeats: DEFAULT_REPEATS,
    streams: nsocks,
    version: 12,
    out: 'bench-results',
    timeout: 30,
    quick: false,
    lib: 'build/libnccl-net-tsnet.so',
    rateSizes: DEFAULT_RATE_SIZES,
    ratePairs: DEFAULT_RATE_PAIRS,
    inflight: 32,
    ofi: [...OFI_PROVIDERS],
    ofiExplicit: false,
  };
  const given = new Set<string>();
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const [flag, inline] = a.includes('=') ? [a.slice(0, a.indexOf('=')), a.slice(a.indexOf('=') + 1)] : [a, undefined];
    const value = (): string => {
      if (inline !== undefined) return inline;
      if (i + 1 >= argv.length) throw new Error(`${flag} needs a value`);
      return argv[++i];
    };
    given.add(flag);
    switch (flag) {
      case '--help':
      case '-h':
        return 'help';
      case '--quick':
        o.quick = true;
        break;
      case '--sizes':
        o.sizes = sizeList(flag, value(), false);
        break;
      case '--rate-sizes':
        o.rateSizes = sizeList(flag, value(), true);
        break;
      case '--rate-pairs': {
        const text = value();
        o.ratePairs = text.split(',').filter((s) => s.trim() !== '').map((s) => positive(flag, s.trim(), true));
        if (o.ratePairs.length === 0) throw new Error('--rate-pairs needs at least one count');
        if (o.ratePairs.some((n) => n > 16)) throw new Error('--rate-pairs: at most 16 comm pairs');
        break;
      }
      case '--inflight':
        o.inflight = positive(flag, value(), true);
        if (o.inflight > 32) throw new Error('--inflight must be 1..32');
        break;
      case '--ofi': {
        const text = value().trim();
        o.ofiExplicit = true;
        if (text === 'none') {
          o.ofi = [];
          break;
        }
        const names = text.split(',').map((s) => s.trim()).filter((s) => s !== '');
        for (const n of names)
          if (!OFI_PROVIDERS.includes(n as OfiProvider)) throw new Error(`--ofi: unknown provider '${n}' (tcp, shm or none)`);
        if (names.length === 0) throw new Error('--ofi needs tcp,shm, tcp, shm or none');
        o.ofi = OFI_PROVIDERS.filter((p) => names.includes(p));
        break;
      }
      case '--duration':
        o.duration = positive(flag, value(), false);
        break;
      case '--warmup':
        o.warmup = Number(value());
        if (!(o.warmup >= 0)) throw new Error('--warmup needs a number >= 0');
        break;
      case '--repeats':
        o.repeats = positive(flag, value(), true);
        break;
      case '--streams':
        o.streams = positive(flag, value(), true);
        if (o.streams > 64) throw new Error('--streams is at most 64');
        break;
      case '--version':
        o.version = positive(flag, value(), true);
        if (o.version < 6 || o.version > 12) throw new Error('--version must be 6..12');
        break;
      case '--out':
        o.out = value();
        break;
      case '--timeout':
        o.timeout = positive(flag, value(), false);
        break;
      case '--lib':
        o.lib = value();
        break;
      default:
        throw new Error(`unknown option '${a}' (try --help)`);
    }
  }
  if (o.quick) {
    if (!given.has('--sizes')) o.sizes = QUICK_SIZES;
    if (!given.has('--rate-sizes')) o.rateSizes = QUICK_RATE_SIZES;
    if (!given.has('--repeats')) o.repeats = 1;
    if (!given.has('--duration')) o.duration = 0.1;
    if (!given.has('--warmup')) o.warmup = 0.05;
  }
  o.sizes = [...new Set(o.sizes)].sort((x, y) => x - y);
  o.rateSizes = [...new Set(o.rateSizes)].sort((x, y) => x - y);
  o.ratePairs = [...new Set(o.ratePairs)].sort((x, y) => x - y);
  return o;
}

/** 8 B, 4 KiB, 1 MiB, 1.5 MiB. */
export function formatSize(n: number): string {
  const units: [number, string][] = [
    [1 << 30, 'GiB'],
    [1 << 20, 'MiB'],
    [1 << 10, 'KiB'],
  ];
  for (const [u, name] of units) if (n >= u) return `${Number((n / u).toFixed(n % u === 0 ? 0 : 1))} ${name}`;
  return `${n} B`;
}
