// bench.svg: bandwidth and latency against message size, tsnet against the TCP baselines,
// drawn by Apache ECharts' server-side SVG renderer (no DOM, no canvas).
import * as echarts from 'echarts';
import { formatSize } from './options';
import type { Point, Spread } from './report';

const COLORS = { tsnet: '#1f6fd1', tcp1: '#e8710a', tcpN: '#1e8e3e' };

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
  };
}

type Pick = (p: Point) => Spread | null | undefined;

function data(points: Point[], pick: Pick): [number, number][] {
  return points.flatMap((p) => {
    const s = pick(p);
    return s && s.median > 0 ? [[p.size, s.median] as [number, number]] : [];
  });
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

export function renderSvg(points: Point[], info: PlotInfo): string {
  const n = seriesNames(info.streams);
  const width = 1200;
  const height = 560;
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
      { data: [n.bwTsnet, n.bwTcp1, n.bwTcpN], left: '24%', top: 86, orient: 'horizontal', textAlign: 'center' },
      { data: [n.latTsnet, n.latTsnetP99, n.latTcp, n.latTcpP99], left: '60%', top: 86 },
    ],
    grid: [
      { left: 70, width: width / 2 - 110, top: 120, bottom: 60 },
      { left: width / 2 + 50, width: width / 2 - 90, top: 120, bottom: 60 },
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
    ],
  });
  const svg = chart.renderToSVGString();
  chart.dispose();
  return svg;
}
