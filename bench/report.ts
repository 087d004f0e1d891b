// From measurements to figures: medians and spreads per size and series, ratios, the tables
// (latency and bandwidth, one per libfabric provider, message rate) and the verdict on the two
// targets.
import { formatSize, type OfiProvider } from './options';
import type { BwLine, LatLine, Measurement, Series } from './run';

export const TARGETS = {
  bandwidthRatioMin: 0.95, // tsnet / TCP with the same streams, at sizes >= bandwidthFromSize
  bandwidthFromSize: 1 << 20,
  latencyRatioMax: 1.5, // tsnet / TCP one-way median latency at latencySize
  latencySize: 8,
};

/** The repeats of one figure: their median, min and max, and every value. */
export interface Spread {
  median: number;
  min: number;
  max: number;
  values: number[];
}

export interface Point {
  size: number;
  latencyUs: {
    tsnet: { median: Spread; p99: Spread } | null;
    tcp: { median: Spread; p99: Spread } | null;
  };
  bandwidthGBps: { tsnet: Spread | null; tcp1: Spread | null; tcpN: Spread | null };
  ratios: {
    latency: number | null; // tsnet / tcp, median one-way latency
    latencyP99: number | null;
    bandwidth: number | null; // tsnet / tcp with --streams streams
    bandwidthVsOneStream: number | null; // tsnet / tcp with one stream
  };
}

export interface Verdict {
  bandwidth: { met: boolean | null; worstRatio: number | null; worstSize: number | null; text: string };
  latency: { met: boolean | null; ratio: number | null; text: string };
}

export function spread(values: number[]): Spread | null {
  if (values.length === 0) return null;
  const v = [...values].sort((a, b) => a - b);
  const mid = v.length >> 1;
  const median = v.length % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
  return { median, min: v[0], max: v[v.length - 1], values };
}

function ratio(a: Spread | null | undefined, b: Spread | null | undefined): number | null {
  return a && b && b.median > 0 ? a.median / b.median : null;
}

/** Groups the successful measurements of the first table by size and series. */
export function aggregate(sizes: number[], ms: Measurement[], streams: number): Point[] {
  return sizes.map((size) => {
    const ok = ms.filter((m) => m.phase === 'latbw' && m.size === size && m.result);
    const lat = (mode: 'tsnet-lat' | 'tcp-lat') => {
      const lines = ok.filter((m) => m.mode === mode).map((m) => m.result as LatLine);
      const median = spread(lines.map((l) => l.lat_us.median));
      const p99 = spread(lines.map((l) => l.lat_us.p99));
      return median && p99 ? { median, p99 } : null;
    };
    const bw = (mode: 'tsnet-bw' | 'tcp-bw', n: number | null) =>
      spread(ok.filter((m) => m.mode === mode && m.streams === n).map((m) => (m.result as BwLine).bw_GBps));
    const tsnetLat = lat('tsnet-lat');
    const tcpLat = lat('tcp-lat');
    const tsnetBw = bw('tsnet-bw', null);
    const tcp1 = bw('tcp-bw', 1);
    const tcpN = bw('tcp-bw', streams);
    return {
      size,
      latencyUs: { tsnet: tsnetLat, tcp: tcpLat },
      bandwidthGBps: { tsnet: tsnetBw, tcp1, tcpN },
      ratios: {
        latency: ratio(tsnetLat?.median, tcpLat?.median),
        latencyP99: ratio(tsnetLat?.p99, tcpLat?.p99),
        bandwidth: ratio(tsnetBw, tcpN),
        bandwidthVsOneStream: ratio(tsnetBw, tcp1),
      },
    };
  });
}

/** tsnet over one libfabric provider at one size, against the first table's plain TCP. */
export interface OfiPoint {
  size: number;
  latencyUs: { median: Spread; p99: Spread } | null;
  bandwidthGBps: Spread | null;
  connectSeconds: Spread | null; // from the first listen until every comm was up (bench.c's setup_s)
  ratios: {
    latency: number | null; // ofi / plain TCP, median one-way latency
    latencyP99: number | null;
    bandwidth: number | null; // ofi / plain TCP with --streams streams
    bandwidthVsTsnetTcp: number | null; // ofi / tsnet over its TCP transport
  };
}

export function aggregateOfi(provider: OfiProvider, ms: Measurement[], points: Point[]): OfiPoint[] {
  const series: Series = `ofi-${provider}`;
  return points.map((p) => {
    const ok = ms.filter((m) => m.phase === 'ofi' && m.series === series && m.size === p.size && m.result);
    const lat = ok.filter((m) => m.mode === 'tsnet-lat').map((m) => m.result as LatLine);
    const median = spread(lat.map((l) => l.lat_us.median));
    const p99 = spread(lat.map((l) => l.lat_us.p99));
    const latencyUs = median && p99 ? { median, p99 } : null;
    const bandwidthGBps = spread(ok.filter((m) => m.mode === 'tsnet-bw').map((m) => (m.result as BwLine).bw_GBps));
    const connect = ok.flatMap((m) => (m.result?.setup_s ? [m.result.setup_s.connect] : []));
    return {
      size: p.size,
      latencyUs,
      bandwidthGBps,
      connectSeconds: spread(connect),
      ratios: {
        latency: ratio(latencyUs?.median, p.latencyUs.tcp?.median),
        latencyP99: ratio(latencyUs?.p99, p.latencyUs.tcp?.p99),
        bandwidth: ratio(bandwidthGBps, p.bandwidthGBps.tcpN),
        bandwidthVsTsnetTcp: ratio(bandwidthGBps, p.bandwidthGBps.tsnet),
      },
    };
  });
}

/** Messages per second of one series at one size over one number of comm pairs (TCP: streams). */
export interface RatePoint {
  size: number;
  pairs: number;
  series: Series;
  inflight: number;
  msgsPerS: Spread | null;
  ratio: number | null; // msgs/s / plain TCP's at the same size and pairs (null for TCP itself)
  cpuUsPerMsg: { sendProto: Spread; recvProto: Spread; sendIo: Spread; recvIo: Spread } | null; // tsnet only
}

export const RATE_SERIES: readonly Series[] = ['tsnet', 'tcp'];

export function aggregateRate(sizes: number[], pairs: number[], inflight: number, ms: Measurement[]): RatePoint[] {
  const out: RatePoint[] = [];
  for (const size of sizes)
    for (const n of pairs) {
      const ok = ms.filter((m) => m.phase === 'rate' && m.size === size && m.pairs === n && m.result);
      const rate = (series: Series) =>
        spread(ok.filter((m) => m.series === series).map((m) => (m.result as BwLine).msgs_per_s ?? 0));
      const tcp = rate('tcp');
      for (const series of RATE_SERIES) {
        const lines = ok.filter((m) => m.series === series).map((m) => m.result as BwLine);
        const cpus = lines.flatMap((l) => (l.cpu_us_per_msg ? [l.cpu_us_per_msg] : []));
        const cpu = (k: keyof NonNullable<BwLine['cpu_us_per_msg']>) => spread(cpus.map((c) => c[k]));
        const sendProto = cpu('send_proto');
        const recvProto = cpu('recv_proto');
        const sendIo = cpu('send_io');
        const recvIo = cpu('recv_io');
        const msgsPerS = rate(series);
        out.push({
          size,
          pairs: n,
          series,
          inflight,
          msgsPerS,
          ratio: series === 'tcp' ? null : ratio(msgsPerS, tcp),
          cpuUsPerMsg: sendProto && recvProto && sendIo && recvIo ? { sendProto, recvProto, sendIo, recvIo } : null,
        });
      }
    }
  return out;
}

export function verdict(points: Point[]): Verdict {
  const big = points.filter((p) => p.size >= TARGETS.bandwidthFromSize && p.ratios.bandwidth !== null);
  let bandwidth: Verdict['bandwidth'];
  if (big.length === 0) {
    bandwidth = { met: null, worstRatio: null, worstSize: null, text: `not measured (no size >= ${formatSize(TARGETS.bandwidthFromSize)})` };
  } else {
    const worst = big.reduce((a, b) => ((a.ratios.bandwidth as number) <= (b.ratios.bandwidth as number) ? a : b));
    const r = worst.ratios.bandwidth as number;
    const met = r >= TARGETS.bandwidthRatioMin;
    bandwidth = {
      met,
      worstRatio: r,
      worstSize: worst.size,
      text: `${met ? 'MET' : 'NOT MET'}: lowest tsnet / TCP bandwidth at >= ${formatSize(TARGETS.bandwidthFromSize)} is ${r.toFixed(2)} (at ${formatSize(worst.size)}); target >= ${TARGETS.bandwidthRatioMin}`,
    };
  }
  const small = points.find((p) => p.size === TARGETS.latencySize);
  let latency: Verdict['latency'];
  if (!small || small.ratios.latency === null) {
    latency = { met: null, ratio: null, text: `not measured (size ${TARGETS.latencySize} not in --sizes)` };
  } else {
    const r = small.ratios.latency;
    const met = r <= TARGETS.latencyRatioMax;
    latency = {
      met,
      ratio: r,
      text: `${met ? 'MET' : 'NOT MET'}: ${formatSize(TARGETS.latencySize)} latency is ${r.toFixed(2)} x plain TCP ping-pong (median); target <= ${TARGETS.latencyRatioMax}`,
    };
  }
  return { bandwidth, latency };
}

function num(x: number | null | undefined, digits: number): string {
  if (x === null || x === undefined) return '-';
  return x >= 1000 ? x.toFixed(0) : x.toPrecision(digits);
}

function withSpread(s: Spread | null, digits = 3): string {
  if (!s) return '-';
  if (s.values.length < 2) return num(s.median, digits);
  return `${num(s.median, digits)} (${num(s.min, digits)}-${num(s.max, digits)})`;
}

/** Columns: text ones (the first, and those in `left`) left-aligned, figures right-aligned, a rule under the head. */
function layout(head: string[], rows: string[][], left: number[] = []): string {
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (cells: string[]) =>
    cells.map((c, i) => (i === 0 || left.includes(i) ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ');
  return [line(head), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(line)].join('\n');
}

/** One libfabric provider's table: tsnet over it, ratios against the first table's plain TCP. */
export function ofiTable(points: OfiPoint[]): string {
  const head = ['size', 'lat p50', 'p99', 'lat x', 'GB/s', 'bw x'];
  const rows = points.map((p) => [
    formatSize(p.size),
    withSpread(p.latencyUs?.median ?? null),
    num(p.latencyUs?.p99.median, 3),
    num(p.ratios.latency, 3),
    withSpread(p.bandwidthGBps),
    num(p.ratios.bandwidth, 3),
  ]);
  return layout(head, rows);
}

/** The message-rate table. */
export function rateTable(points: RatePoint[]): string {
  const head = ['size', 'pairs', 'series', 'msgs/s', 'x tcp', 'send proto µs', 'recv proto µs', 'send io µs', 'recv io µs'];
  const rows = points.map((p) => [
    formatSize(p.size),
    String(p.pairs),
    p.series,
    withSpread(p.msgsPerS),
    num(p.ratio, 3),
    withSpread(p.cpuUsPerMsg?.sendProto ?? null),
    withSpread(p.cpuUsPerMsg?.recvProto ?? null),
    withSpread(p.cpuUsPerMsg?.sendIo ?? null),
    withSpread(p.cpuUsPerMsg?.recvIo ?? null),
  ]);
  return layout(head, rows, [2]);
}

/** The results table: medians over the repeats, (min-max) where there are several. */
export function table(points: Point[], streams: number): string {
  const head = ['size', 'tsnet lat p50', 'p99', 'tcp lat p50', 'p99', 'lat x', 'tsnet GB/s', 'tcp-1 GB/s', `tcp-${streams} GB/s`, 'bw x'];
  const rows = points.map((p) => [
    formatSize(p.size),
    withSpread(p.latencyUs.tsnet?.median ?? null),
    num(p.latencyUs.tsnet?.p99.median, 3),
    withSpread(p.latencyUs.tcp?.median ?? null),
    num(p.latencyUs.tcp?.p99.median, 3),
    num(p.ratios.latency, 3),
    withSpread(p.bandwidthGBps.tsnet),
    withSpread(p.bandwidthGBps.tcp1),
    withSpread(p.bandwidthGBps.tcpN),
    num(p.ratios.bandwidth, 3),
  ]);
  return layout(head, rows);
}
