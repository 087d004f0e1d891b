// Turns a folder of nccl-tests logs (from nccl-tests/run.sh) into docs/results/<name>/:
// results.json (every row of every run), results.md (the checks of every run, then per test
// and mode busbw per size for every variant present with tsnet / Socket and ofi / TCP ratios),
// busbw.svg (a plot), and the raw logs beside them. Exits 1 when a run has a problem
// (problems() below says which).
//
//   node dist/nccl-tests/report.js LOG_FOLDER OUT_FOLDER [--title T]
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as echarts from 'echarts';
import { type Parsed, parseLog, wrongTotal } from './parse';

export interface Run extends Parsed {
  name: string;
  test: string;
  mode: string;
  variant: string;
  status: number | null;
  seconds: number | null;
  wrong: number;
  checks: { loadedTsnet: boolean; usedTsnet: boolean; usedSocket: boolean };
}

/** run.sh's variants in the order of the tables and the plot; others follow, by name. */
export const VARIANT_ORDER = ['tsnet-ofi-ipc', 'tsnet-ofi', 'tsnet-ofi-rails', 'tsnet-ofi-rails-comm', 'tsnet-ofi-host', 'tsnet', 'socket', 'socket-tuned'];
const LABEL: Record<string, string> = {
  'tsnet-ofi-ipc': 'tsnet over ofi, CUDA IPC',
  'tsnet-ofi': 'tsnet over ofi (GDR)',
  'tsnet-ofi-rails': 'tsnet over ofi (host staging, 4 rails)',
  'tsnet-ofi-rails-comm': 'tsnet over ofi (host staging, 4 rails, small messages on one per comm)',
  'tsnet-ofi-host': 'tsnet over ofi (host staging)',
  tsnet: 'tsnet over TCP',
  socket: 'Socket (defaults)',
  'socket-tuned': 'Socket (4 threads x 4 sockets)',
};
/** Short names for the table's headers: `X busbw` and `X / Y`. */
const COLUMN: Record<string, string> = { 'tsnet-ofi-ipc': 'ofi-ipc', 'tsnet-ofi': 'ofi', 'tsnet-ofi-rails': 'ofi-rails', 'tsnet-ofi-rails-comm': 'ofi-rails-comm', 'tsnet-ofi-host': 'ofi-host', tsnet: 'tsnet', socket: 'Socket', 'socket-tuned': 'Socket tuned' };
const DENOMINATOR: Record<string, string> = { ...COLUMN, 'socket-tuned': 'tuned' };

const isTsnet = (v: string) => v === 'tsnet' || v.startsWith('tsnet-');
const isOfi = (v: string) => v.startsWith('tsnet-ofi');
/** Variants whose channels should all be GPUDirect, and those that must have none. */
const GDR_WANTED = new Set(['tsnet-ofi', 'tsnet-ofi-ipc']);
const GDR_OFF = new Set(['tsnet-ofi-host', 'tsnet-ofi-rails', 'tsnet-ofi-rails-comm']);

export function orderVariants(present: Iterable<string>): string[] {
  const set = new Set(present);
  const rank = (v: string) => (VARIANT_ORDER.includes(v) ? VARIANT_ORDER.indexOf(v) : VARIANT_ORDER.length);
  return [...set].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
}

/** The label of a variant; the plain tsnet variant says the transport its runs reported. */
export function variantLabel(v: string, runs: Run[] = []): string {
  if (v !== 'tsnet') return LABEL[v] ?? v;
  const ts = [...new Set(runs.filter((r) => r.variant === v).flatMap((r) => r.transports))];
  return ts.length === 1 && ts[0] !== 'tcp' ? `tsnet over ${ts[0]}` : LABEL[v];
}

/**
 * The ratio columns, [numerator, denominator], for the variants present (in order): every
 * tsnet* variant against Socket tuned, else Socket (plain tsnet against both, as the reports
 * before the ofi variants did), then every tsnet-ofi* variant against tsnet over TCP.
 */
export function ratioColumns(variants: string[]): [string, string][] {
  const sockets = ['socket', 'socket-tuned'].filter((v) => variants.includes(v));
  const out: [string, string][] = [];
  for (const v of variants.filter(isTsnet)) {
    const against = v === 'tsnet' ? sockets : sockets.slice(-1);
    for (const s of against) out.push([v, s]);
  }
  if (variants.includes('tsnet')) for (const v of variants.filter(isOfi)) out.push([v, 'tsnet']);
  return out;
}

/** The table's heading for a mode, with the ranks the logs listed. */
export function modeHeading(mode: string, ranks: number): string {
  const n = ranks || '?';
  const g = /^g([2-8])$/.exec(mode);
  if (g) return `${g[1]} GPUs in one process (-g ${g[1]})`;
  if (mode === 'mpi') return `${n} processes under mpirun (one GPU each)`;
  if (mode === 'mpi1') return `${n} processes on one GPU (each its own NCCL host, MPS)`;
  return mode;
}

/** The checks table's GDR cell: GDRDMA channels of all channels, each direction. */
export function gdrCell(gdr: Parsed['gdr']): string {
  const { send, recv } = gdr;
  if (send.gdr + send.plain + recv.gdr + recv.plain === 0) return '–';
  if (send.gdr + recv.gdr === 0) return 'none';
  return `send ${send.gdr}/${send.gdr + send.plain}, recv ${recv.gdr}/${recv.gdr + recv.plain}`;
}

/**
 * A remark on a run's GPUDirect: a GDR variant with channels without it (noted, not a
 * failure), or the host-staging variant with GDRDMA channels (a problem: it did not measure
 * what its name says).
 */
export function gdrNote(r: Pick<Run, 'variant' | 'gdr'>): { text: string; problem: boolean } | null {
  const { send, recv } = r.gdr;
  if (GDR_OFF.has(r.variant) && send.gdr + recv.gdr > 0) return { text: 'GDRDMA with GDR off', problem: true };
  if (GDR_WANTED.has(r.variant) && (send.plain + recv.plain > 0 || send.gdr + recv.gdr === 0)) return { text: 'not all channels GDRDMA', problem: false };
  return null;
}

/** Why a run does not count: empty when it ran, checked, and measured what its name says. */
export function problems(r: Run): string[] {
  const out: string[] = [];
  if (r.status !== 0) out.push(`exit ${r.status}`);
  if (r.wrong !== 0) out.push(`#wrong ${r.wrong}`);
  if (r.failed) out.push('NCCL or nccl-tests reported an error');
  if (r.rows.length === 0) out.push('no result rows');
  if (r.declaredRanks !== null && r.ranks !== r.declaredRanks) out.push(`${r.ranks} ranks listed, ${r.declaredRanks} asked for`);
  if (isTsnet(r.variant)) {
    if (!r.checks.loadedTsnet) out.push('tsnet not loaded');
    if (!r.checks.usedTsnet) out.push('tsnet not used');
    if (isOfi(r.variant) && r.transports.some((t) => t !== 'ofi')) out.push(`tsnet ran over ${r.transports.join(', ')}, not ofi`);
  }
  const note = gdrNote(r);
  if (note?.problem) out.push(`${note.text} (${gdrCell(r.gdr)})`);
  return out;
}

/** One run from its log's name (TEST.MODE.VARIANT), text and runs.tsv entry. */
export function toRun(name: string, text: string, s?: { status: number; seconds: number }): Run {
  const [test, mode, variant] = name.split('.');
  const p = parseLog(text);
  return {
    ...p,
    name,
    test,
    mode,
    variant,
    status: s?.status ?? null,
    seconds: s?.seconds ?? null,
    wrong: wrongTotal(p.rows),
    checks: {
      loadedTsnet: p.loaded.some((l) => /tsnet/.test(l)),
      usedTsnet: p.using.some((l) => /Using network tsnet/i.test(l)),
      usedSocket: p.using.some((l) => /Using network Socket/i.test(l)),
    },
  };
}

function human(bytes: number): string {
  for (const [u, f] of [['GiB', 2 ** 30], ['MiB', 2 ** 20], ['KiB', 2 ** 10]] as const) if (bytes >= f) return `${bytes / f} ${u}`;
  return `${bytes} B`;
}

function readRuns(dir: string): Run[] {
  const status = new Map<string, { status: number; seconds: number }>();
  const tsv = path.join(dir, 'runs.tsv');
  if (fs.existsSync(tsv))
    for (const line of fs.readFileSync(tsv, 'utf8').split('\n').slice(1).filter(Boolean)) {
      const [name, st, secs] = line.split('\t');
      status.set(name, { status: Number(st), seconds: Number(secs) });
    }
  return fs
    .readdirSync(dir)
    .filter((f) => f.endsWith('.log'))
    .sort()
    .map((f) => {
      const name = f.replace(/\.log$/, '');
      return toRun(name, fs.readFileSync(path.join(dir, f), 'utf8'), status.get(name));
    });
}

function busbw(run: Run | undefined, size: number): number | undefined {
  const r = run?.rows.find((x) => x.size === size);
  return r ? r.outOfPlace.busbw : undefined;
}

const fmt = (x: number | undefined, d = 2) => (x === undefined || !Number.isFinite(x) ? '–' : x.toFixed(d));

/** The busbw table of one (test, mode): a column per variant present, then the ratios. */
export function table(runs: Run[], test: string, mode: string): string[] {
  const group = runs.filter((r) => r.test === test && r.mode === mode);
  const variants = orderVariants(group.map((r) => r.variant));
  const by = (v: string) => group.find((r) => r.variant === v);
  const ratios = ratioColumns(variants);
  const sizes = [...new Set(group.flatMap((r) => r.rows.map((x) => x.size)))].sort((a, b) => a - b);
  const headers = [...variants.map((v) => `${COLUMN[v] ?? v} busbw`), ...ratios.map(([a, b]) => `${COLUMN[a] ?? a} / ${DENOMINATOR[b] ?? b}`)];
  const out = [
    `### ${test}, ${modeHeading(mode, Math.max(0, ...group.map((r) => r.ranks || r.declaredRanks || 0)))}`,
    '',
    `| size | ${headers.join(' | ')} |`,
    `|---:|${headers.map(() => '---:|').join('')}`,
  ];
  const ratio = (a?: number, b?: number) => (a !== undefined && b ? fmt(a / b) : '–');
  for (const s of sizes) {
    const bw = (v: string) => busbw(by(v), s);
    out.push(`| ${human(s)} | ${[...variants.map((v) => fmt(bw(v))), ...ratios.map(([a, b]) => ratio(bw(a), bw(b)))].join(' | ')} |`);
  }
  out.push('', `GB/s, out-of-place. Average busbw: ${variants.map((v) => `${variantLabel(v, runs)} ${fmt(by(v)?.avgBusbw ?? undefined)}`).join(', ')}.`, '');
  return out;
}

/** The per-run checks: exit status, #wrong, rows, ranks, the network NCCL loaded and used, GPUDirect. */
export function checksTable(runs: Run[]): string[] {
  const out = ['| run | exit | #wrong | rows | ranks | NCCL loaded / used | GDR | seconds |', '|---|---:|---:|---:|---:|---|---|---:|'];
  for (const r of runs) {
    const net = isTsnet(r.variant)
      ? `${r.checks.loadedTsnet ? 'loaded tsnet' : '**tsnet not loaded**'}, ${r.checks.usedTsnet ? 'used tsnet' : '**tsnet not used**'}`
      : r.checks.usedSocket ? 'used Socket' : '**Socket not used**';
    const note = gdrNote(r);
    const remark = !note ? '' : note.problem ? ` (**${note.text}**)` : ` (*${note.text}*)`;
    out.push(`| ${r.name} | ${r.status ?? '?'} | ${r.wrong} | ${r.rows.length} | ${r.ranks || '?'} | ${net} | ${gdrCell(r.gdr)}${remark} | ${r.seconds ?? '?'} |`);
  }
  return out;
}

function plot(runs: Run[], groups: [string, string][]): string {
  const width = 560 * Math.min(2, groups.length);
  const rowsN = Math.ceil(groups.length / 2);
  const height = 360 * rowsN;
  const variants = orderVariants(runs.map((r) => r.variant));
  const chart = echarts.init(null, null, { renderer: 'svg', ssr: true, width, height });
  const grids = groups.map((_, i) => ({
    left: `${(i % 2) * 50 + 6}%`,
    width: '38%',
    top: `${Math.floor(i / 2) * (100 / rowsN) + 9}%`,
    height: `${100 / rowsN - 20}%`,
  }));
  chart.setOption({
    animation: false,
    title: groups.map(([t, m], i) => ({ text: `${t} (${m})`, left: grids[i].left, top: `${Math.floor(i / 2) * (100 / rowsN) + 1}%`, textStyle: { fontSize: 13 } })),
    legend: { bottom: 0 },
    grid: grids,
    xAxis: groups.map((_, i) => ({ type: 'log', logBase: 2, gridIndex: i, name: 'bytes', nameLocation: 'middle', nameGap: 22,
      axisLabel: { formatter: (v: number) => human(v).replace(' ', '') } })),
    yAxis: groups.map((_, i) => ({ type: 'value', gridIndex: i, name: 'busbw GB/s' })),
    series: groups.flatMap(([t, m], i) =>
      variants.map((v) => ({
        name: variantLabel(v, runs),
        type: 'line',
        xAxisIndex: i,
        yAxisIndex: i,
        showSymbol: false,
        data: (runs.find((r) => r.test === t && r.mode === m && r.variant === v)?.rows ?? []).map((r) => [r.size, r.outOfPlace.busbw]),
      })),
    ),
  });
  const svg = chart.renderToSVGString();
  chart.dispose();
  return svg;
}

function main(): void {
  const [dir, outDir, ...rest] = process.argv.slice(2);
  if (!dir || !outDir) {
    process.stderr.write('usage: report.js LOG_FOLDER OUT_FOLDER [--title T]\n');
    process.exit(2);
  }
  const title = rest[0] === '--title' ? rest[1] : path.basename(outDir);
  const runs = readRuns(dir);
  fs.mkdirSync(path.join(outDir, 'logs'), { recursive: true });
  for (const f of fs.readdirSync(dir)) if (f.endsWith('.log') || f.endsWith('.tsv') || f.endsWith('.txt')) fs.copyFileSync(path.join(dir, f), path.join(outDir, 'logs', f));
  const groups = [...new Set(runs.map((r) => `${r.test}|${r.mode}`))].map((g) => g.split('|') as [string, string]);
  const md = [`# nccl-tests through tsnet and NCCL's Socket transport: ${title}`, '', ...checksTable(runs), ''];
  for (const [t, m] of groups) md.push(...table(runs, t, m));
  md.push('![busbw against size](busbw.svg)', '');
  fs.writeFileSync(path.join(outDir, 'results.md'), md.join('\n'));
  fs.writeFileSync(path.join(outDir, 'results.json'), JSON.stringify({ title, runs: runs.map(({ warnings, ...r }) => ({ ...r, warnings: warnings.slice(0, 50) })) }, null, 1));
  fs.writeFileSync(path.join(outDir, 'busbw.svg'), plot(runs, groups));
  const bad = runs.map((r) => [r.name, problems(r)] as const).filter(([, p]) => p.length);
  for (const [name, p] of bad) process.stderr.write(`report: ${name}: ${p.join('; ')}\n`);
  process.stdout.write(`report: ${runs.length} runs, ${bad.length} with problems -> ${outDir}\n`);
  process.exitCode = bad.length ? 1 : 0;
}

if (require.main === module) main();
