// bench.svg: bandwidth and latency against message size, tsnet (over its TCP transport and
// over libfabric) against the TCP baselines; bench-rate.svg: messages per second. Both drawn by
// Apache ECharts' server-side SVG renderer (no DOM, no canvas).
import * as echarts from 'echarts';
import { formatSize, type OfiProvider } from './options';
import type { OfiPoint, Point, RatePoint, Spread } from './report';

const COLORS = { tsnet: '#1f6fd1', tcp1: '#e8710a', tcpN: '#1e8e3e', ofiTcp: '#9334e6', ofiShm: '#d01884' };

/** The series names drawn (and shown in the legends). */
export function seriesNames(streams: number) {
  return {
    bwTsnet: `tsnet (${streams} sockets)`,
    bwTcp1: 'TCP, 1 stream',
    bwTcpN: `TCP, ${streams} streams`,
    latTsnet: 'tsnet median',
    latTsnetP99: 'tsnet p99',
    latTcp: 'TCP median',
    latTcpP99: 'TCP p99',
    bwOfi: { tcp: 'tsnet over ofi tcp', shm: 'tsnet over ofi shm' } as Record<OfiProvider, string>,
    latOfi: { tcp: 'ofi tcp median', shm: 'ofi shm median' } as Record<OfiProvider, string>,
    rateTsnet: 'tsnet',
    rateTcp: 'TCP',
  };
}

type Pick = (p: Point) => Spread | null | undefined;

function data(points: Point[], pick: Pick): [number, number][] {
  return points.flatMap((p) => {
    const s = pick(p);
    return s && s.median > 0 ? [[p.size, s.median] as [number, number]] : [];
  });
}

/** 38.4k, 1.41M: message rates. */
function si(v: number): string {
  if (v >= 1e6) return `${Number((v / 1e6).toPrecision(3))}M`;
  if (v >= 1e3) return `${Number((v / 1e3).toPrecision(3))}k`;
  return String(Number(v.toPrecision(3)));
}

/** 0.0001, 0.01, 1, 100, 10000: log-axis ticks without float noise. */
function tick(v: number): string {
  return String(Number(v.toPrecision(2)));
}

export interface PlotInfo {
  title: string;
  subtitle: string;
  streams: number;
}

/** tsnet over each libfabric provider run, drawn next to the first table's series. */
export type OfiSeries = { provider: OfiProvider; points: OfiPoint[] }[];

function ofiData(points: OfiPoint[], pick: (p: OfiPoint) => Spread | null | undefined): [number, number][] {
  return points.flatMap((p) => {
    const s = pick(p);
    return s && s.median > 0 ? [[p.size, s.median] as [number, number]] : [];
  });
}

export function renderSvg(points: Point[], info: PlotInfo, ofi: OfiSeries = []): string {
  const n = seriesNames(info.streams);
  const width = 1200;
  const top = ofi.length ? 150 : 120; // room for the legends' second row
  const height = 560 + top - 120;
  const chart = echarts.init(null, null, { renderer: 'svg', ssr: true, width, height });
  const sizeAxis = (gridIndex: number) => ({
    type: 'log' as const,
    logBase: 2,
    gridIndex,
    name: 'message size',
    nameLocation: 'middle' as const,
    nameGap: 28,
    min: Math.min(...points.map((p) => p.size)),
    max: Math.max(...points.map((p) => p.size)),
    axisLabel: { formatter: (v: number) => formatSize(v).replace(' ', ''), hideOverlap: true },
    splitLine: { show: true, lineStyle: { color: '#eee' } },
  });
  const line = (name: string, xi: number, pts: [number, number][], color: string, dashed = false) => ({
    type: 'line' as const,
    name,
    xAxisIndex: xi,
    yAxisIndex: xi,
    data: pts,
    symbolSize: 6,
    lineStyle: { color, width: 2, type: dashed ? ('dashed' as const) : ('solid' as const) },
    itemStyle: { color },
  });
  chart.setOption({
    animation: false,
    backgroundColor: '#fff',
    title: [
      { text: info.title, subtext: info.subtitle, left: 'center', top: 4, textStyle: { fontSize: 16 } },
      { text: 'Bandwidth, 8 messages in flight (GB/s)', left: '24%', top: 64, textAlign: 'center', textStyle: { fontSize: 13 } },
      { text: 'One-way latency, ping-pong (µs)', left: '76%', top: 64, textAlign: 'center', textStyle: { fontSize: 13 } },
    ],
    legend: [
      { data: [n.bwTsnet, n.bwTcp1, n.bwTcpN, ...ofi.map((o) => n.bwOfi[o.provider])], left: 70, width: width / 2 - 110, top: 86 },
      { data: [n.latTsnet, n.latTsnetP99, n.latTcp, n.latTcpP99, ...ofi.map((o) => n.latOfi[o.provider])], left: width / 2 + 50, width: width / 2 - 90, top: 86 },
    ],
    grid: [
      { left: 70, width: width / 2 - 110, top, bottom: 60 },
      { left: width / 2 + 50, width: width / 2 - 90, top, bottom: 60 },
    ],
    xAxis: [sizeAxis(0), sizeAxis(1)],
    yAxis: [
      { type: 'log', gridIndex: 0, name: 'GB/s', axisLabel: { formatter: tick }, splitLine: { lineStyle: { color: '#eee' } } },
      { type: 'log', gridIndex: 1, name: 'µs', axisLabel: { formatter: tick }, splitLine: { lineStyle: { color: '#eee' } } },
    ],
    series: [
      line(n.bwTsnet, 0, data(points, (p) => p.bandwidthGBps.tsnet), COLORS.tsnet),
      line(n.bwTcp1, 0, data(points, (p) => p.bandwidthGBps.tcp1), COLORS.tcp1),
      line(n.bwTcpN, 0, data(points, (p) => p.bandwidthGBps.tcpN), COLORS.tcpN),
      line(n.latTsnet, 1, data(points, (p) => p.latencyUs.tsnet?.median), COLORS.tsnet),
      line(n.latTsnetP99, 1, data(points, (p) => p.latencyUs.tsnet?.p99), COLORS.tsnet, true),
      line(n.latTcp, 1, data(points, (p) => p.latencyUs.tcp?.median), COLORS.tcp1),
      line(n.latTcpP99, 1, data(points, (p) => p.latencyUs.tcp?.p99), COLORS.tcp1, true),
      ...ofi.flatMap((o) => {
        const color = o.provider === 'tcp' ? COLORS.ofiTcp : COLORS.ofiShm;
        return [
          line(n.bwOfi[o.provider], 0, ofiData(o.points, (p) => p.bandwidthGBps), color),
          line(n.latOfi[o.provider], 1, ofiData(o.points, (p) => p.latencyUs?.median), color),
        ];
      }),
    ],
  });
  const svg = chart.renderToSVGString();
  chart.dispose();
  return svg;
}

/** bench-rate.svg: messages per second (log scale) per size and number of comm pairs, tsnet
 * against plain TCP with as many streams, bars at the medians with the min-max of the repeats. */
export function renderRateSvg(points: RatePoint[], info: { title: string; subtitle: string }): string {
  const n = seriesNames(1);
  const width = 1000;
  const height = 520;
  const groups = [...new Set(points.map((p) => `${p.size}/${p.pairs}`))];
  const category = (key: string) => {
    const [size, pairs] = key.split('/').map(Number);
    return `${formatSize(size)}, ${pairs} pair${pairs === 1 ? '' : 's'}`;
  };
  const find = (key: string, series: string) => points.find((p) => `${p.size}/${p.pairs}` === key && p.series === series);
  const bars = (name: string, series: string, color: string) => ({
    type: 'bar' as const,
    name,
    barGap: '10%',
    itemStyle: { color },
    label: {
      show: true,
      position: 'top' as const,
      fontSize: 10,
      formatter: (x: { value: number | null }) => (x.value ? si(x.value) : ''),
    },
    data: groups.map((g) => {
      const m = find(g, series)?.msgsPerS?.median;
      return m && m > 0 ? m : null;
    }),
  });
  const ranges = (series: string, color: string, offset: number) => ({
    type: 'custom' as const,
    name: `${series} min-max`,
    silent: true,
    z: 10,
    renderItem: (
      _params: unknown,
      api: { value: (i: number) => number; coord: (v: [number, number]) => number[]; size: (v: [number, number]) => number[] },
    ) => {
      const x = api.value(0);
      const lo = api.coord([x, api.value(1)]);
      const hi = api.coord([x, api.value(2)]);
      const band = api.size([1, 0])[0];
      const cx = lo[0] + offset * band;
      return {
        type: 'group',
        children: [
          { type: 'line', shape: { x1: cx, y1: lo[1], x2: cx, y2: hi[1] }, style: { stroke: color, lineWidth: 1 } },
          { type: 'line', shape: { x1: cx - 4, y1: lo[1], x2: cx + 4, y2: lo[1] }, style: { stroke: color, lineWidth: 1 } },
          { type: 'line', shape: { x1: cx - 4, y1: hi[1], x2: cx + 4, y2: hi[1] }, style: { stroke: color, lineWidth: 1 } },
        ],
      };
    },
    data: groups.flatMap((g, i) => {
      const s = find(g, series)?.msgsPerS;
      return s && s.values.length > 1 && s.min > 0 ? [[i, s.min, s.max]] : [];
    }),
  });
  const lowest = Math.min(...points.flatMap((p) => (p.msgsPerS && p.msgsPerS.min > 0 ? [p.msgsPerS.min] : [])));
  const floor = Number.isFinite(lowest) ? 10 ** Math.floor(Math.log10(lowest)) : 1;
  const chart = echarts.init(null, null, { renderer: 'svg', ssr: true, width, height });
  chart.setOption({
    animation: false,
    backgroundColor: '#fff',
    title: [{ text: info.title, subtext: info.subtitle, left: 'center', top: 4, textStyle: { fontSize: 16 } }],
    legend: { data: [n.rateTsnet, n.rateTcp], top: 62 },
    grid: { left: 80, right: 30, top: 100, bottom: 60 },
    xAxis: { type: 'category', data: groups.map(category), name: 'message size, comm pairs (TCP: streams)', nameLocation: 'middle', nameGap: 32 },
    yAxis: { type: 'log', min: floor, name: 'messages/s', axisLabel: { formatter: si }, splitLine: { lineStyle: { color: '#eee' } } },
    series: [
      bars(n.rateTsnet, 'tsnet', COLORS.tsnet),
      bars(n.rateTcp, 'tcp', COLORS.tcpN),
      ranges('tsnet', '#333', -0.2),
      ranges('tcp', '#333', 0.2),
    ],
  });
  const svg = chart.renderToSVGString();
  chart.dispose();
  return svg;
}
