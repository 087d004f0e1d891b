// Turns a folder of nccl-tests logs (from nccl-tests/run.sh) into docs/results/<name>/:
// results.json (every row of every run), results.md (busbw per size, tsnet / Socket ratios,
// the checks), busbw.svg (a plot), and the raw logs beside them.
//
//   node dist/nccl-tests/report.js LOG_FOLDER OUT_FOLDER [--title T]
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as echarts from 'echarts';
import { type Parsed, parseLog, wrongTotal } from './parse';

interface Run extends Parsed {
  name: string;
  test: string;
  mode: string;
  variant: string;
  status: number | null;
  seconds: number | null;
  wrong: number;
  checks: { loadedTsnet: boolean; usedTsnet: boolean; usedSocket: boolean };
}

const VARIANTS = ['tsnet', 'socket', 'socket-tuned'];
const LABEL: Record<string, string> = { tsnet: 'tsnet', socket: 'Socket (defaults)', 'socket-tuned': 'Socket (4 threads x 4 sockets)' };

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
      const [test, mode, variant] = name.split('.');
      const p = parseLog(fs.readFileSync(path.join(dir, f), 'utf8'));
      const s = status.get(name);
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
    });
}

function busbw(run: Run | undefined, size: number): number | undefined {
  const r = run?.rows.find((x) => x.size === size);
  return r ? r.outOfPlace.busbw : undefined;
}

const fmt = (x: number | undefined, d = 2) => (x === undefined || !Number.isFinite(x) ? '–' : x.toFixed(d));

function table(runs: Run[], test: string, mode: string): string[] {
  const by = (v: string) => runs.find((r) => r.test === test && r.mode === mode && r.variant === v);
  const sizes = [...new Set(VARIANTS.flatMap((v) => by(v)?.rows.map((r) => r.size) ?? []))].sort((a, b) => a - b);
  const out = [
    `### ${test}, ${mode === 'g2' ? '2 GPUs in one process (-g 2)' : '2 processes under mpirun'}`,
    '',
    '| size | tsnet busbw | Socket busbw | Socket tuned busbw | tsnet / Socket | tsnet / tuned |',
    '|---:|---:|---:|---:|---:|---:|',
  ];
  for (const s of sizes) {
    const [t, so, tu] = VARIANTS.map((v) => busbw(by(v), s));
    const ratio = (a?: number, b?: number) => (a !== undefined && b ? fmt(a / b) : '–');
    out.push(`| ${human(s)} | ${fmt(t)} | ${fmt(so)} | ${fmt(tu)} | ${ratio(t, so)} | ${ratio(t, tu)} |`);
  }
  out.push('', `GB/s, out-of-place. Average busbw: ${VARIANTS.map((v) => `${LABEL[v]} ${fmt(by(v)?.avgBusbw ?? undefined)}`).join(', ')}.`, '');
  return out;
}

function plot(runs: Run[], groups: [string, string][]): string {
  const width = 560 * Math.min(2, groups.length);
  const rowsN = Math.ceil(groups.length / 2);
  const height = 360 * rowsN;
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
      VARIANTS.map((v) => ({
        name: LABEL[v],
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
  const md = [`# nccl-tests through tsnet and NCCL's Socket transport: ${title}`, ''];
  md.push('| run | exit | #wrong | rows | NCCL loaded / used | seconds |', '|---|---:|---:|---:|---|---:|');
  for (const r of runs) {
    const net = r.variant === 'tsnet'
      ? `${r.checks.loadedTsnet ? 'loaded tsnet' : '**tsnet not loaded**'}, ${r.checks.usedTsnet ? 'used tsnet' : '**tsnet not used**'}`
      : r.checks.usedSocket ? 'used Socket' : '**Socket not used**';
    md.push(`| ${r.name} | ${r.status ?? '?'} | ${r.wrong} | ${r.rows.length} | ${net} | ${r.seconds ?? '?'} |`);
  }
  md.push('');
  for (const [t, m] of groups) md.push(...table(runs, t, m));
  md.push('![busbw against size](busbw.svg)', '');
  fs.writeFileSync(path.join(outDir, 'results.md'), md.join('\n'));
  fs.writeFileSync(path.join(outDir, 'results.json'), JSON.stringify({ title, runs: runs.map(({ warnings, ...r }) => ({ ...r, warnings: warnings.slice(0, 50) })) }, null, 1));
  fs.writeFileSync(path.join(outDir, 'busbw.svg'), plot(runs, groups));
  const bad = runs.filter((r) => r.status !== 0 || r.wrong !== 0 || r.failed || r.rows.length === 0 ||
    (r.variant === 'tsnet' && !(r.checks.loadedTsnet && r.checks.usedTsnet)));
  for (const r of bad) process.stderr.write(`report: ${r.name}: exit ${r.status}, #wrong ${r.wrong}, ${r.rows.length} rows, tsnet loaded/used ${r.checks.loadedTsnet}/${r.checks.usedTsnet}\n`);
  process.stdout.write(`report: ${runs.length} runs, ${bad.length} with problems -> ${outDir}\n`);
  process.exitCode = bad.length ? 1 : 0;
}

main();
