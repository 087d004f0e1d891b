// nccl-tests/parse.ts (rows, ranks, GPUDirect channels) and the decisions of
// nccl-tests/report.ts (variant order, ratio columns, headings, which runs are problems), on
// synthetic logs and on a log of docs/results/h200x2-engine.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseLog, wrongTotal } from '../../nccl-tests/parse';
import { type Run, checksTable, gdrCell, gdrNote, modeHeading, orderVariants, problems, ratioColumns, table, toRun } from '../../nccl-tests/report';

interface LogSpec {
  mode?: string;
  declared?: number;
  ranks?: number[];
  net?: string;
  transport?: string;
  channels?: string[];
  busbw?: number[];
  wrong?: number[];
}

/** A log as run.sh and nccl-tests write it, cut down to the lines the parser reads. */
function log(s: LogSpec = {}): string {
  const { mode = 'mpi1', declared = 2, ranks = [0, 1], net = 'tsnet', transport = 'ofi', channels = [], busbw = [1, 2], wrong = [] } = s;
  const lines = [`# tsnet nccl-tests run: x`, `# mode: ${mode} (whatever it says)`, `# ranks: ${declared}`, '# env: NCCL_NET=tsnet', '# args: -b 8 -e 64'];
  for (const r of ranks) lines.push(`#  Rank  ${r} Group  0 Pid   ${100 + r} on         vm device  0 [0000:00:06] NVIDIA H200`);
  if (net === 'tsnet') lines.push('vm:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin tsnet (v11)', `vm:1:2 [0] NCCL INFO NET/tsnet config: transport = ${transport} (TSNET_TRANSPORT)`);
  lines.push(`vm:1:1 [0] NCCL INFO Using network ${net}`);
  for (const c of channels) lines.push(`vm:1:1 [0] NCCL INFO Channel 00/0 : ${c}`);
  lines.push('#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong ');
  busbw.forEach((bw, i) => {
    const size = 8 << (3 * i);
    const w = wrong[i] ?? 0;
    lines.push(`  ${size}  ${size / 4}  float  sum  -1  25.00  ${bw}  ${bw}  ${w}  24.00  ${bw}  ${bw}  0`);
  });
  lines.push(`# Avg bus bandwidth    : ${busbw.reduce((a, b) => a + b, 0) / busbw.length}`);
  return lines.join('\n');
}

const GDR_SEND = '0[0] -> 1[0] [send] via NET/tsnet/0/GDRDMA';
const GDR_RECV = '1[0] -> 0[0] [receive] via NET/tsnet/0/GDRDMA';
const PLAIN_SEND = '0[0] -> 1[0] [send] via NET/tsnet/0';
const PLAIN_RECV = '1[0] -> 0[0] [receive] via NET/tsnet/0';

function run(variant: string, s: LogSpec = {}, mode = 'mpi1', test = 'all_reduce_perf'): Run {
  const net = variant.startsWith('socket') ? 'Socket' : 'tsnet';
  return toRun(`${test}.${mode}.${variant}`, log({ net, mode, ...s }), { status: 0, seconds: 1 });
}

describe('parseLog', () => {
  it('counts GDRDMA and plain network channels per direction, /Shared and other transports aside', () => {
    const p = parseLog(
      log({
        channels: [
          GDR_SEND,
          GDR_SEND,
          PLAIN_SEND,
          GDR_RECV,
          '1[0] -> 0[0] [receive] via NET/tsnet/0/GDRDMA/Shared',
          PLAIN_RECV,
          '1[0] -> 0[0] [receive] via NET/tsnet/0/Shared',
          '0[0] -> 1[1] via P2P/CUMEM/read',
          '0[0] -> 1[1] [send] via SHM/direct/direct',
        ],
      }),
    );
    expect(p.gdr).toEqual({ send: { gdr: 2, plain: 1 }, recv: { gdr: 2, plain: 2 } });
  });

  it('reads the ranks nccl-tests lists, run.sh header, the transport, the rows and #wrong', () => {
    const p = parseLog(log({ ranks: [0, 1, 2], declared: 3, busbw: [0.5, 1.5, 2.5], wrong: [0, 3, 0] }));
    expect(p.ranks).toBe(3);
    expect(p.declaredRanks).toBe(3);
    expect(p.declaredMode).toBe('mpi1');
    expect(p.transports).toEqual(['ofi']);
    expect(p.rows.map((r) => [r.size, r.outOfPlace.busbw])).toEqual([[8, 0.5], [64, 1.5], [512, 2.5]]);
    expect(wrongTotal(p.rows)).toBe(3);
    expect(p.avgBusbw).toBeCloseTo(1.5);
  });

  it('counts rank numbers, not lines: processes that all call themselves rank 0 are one rank', () => {
    expect(parseLog(log({ ranks: [0, 0] })).ranks).toBe(1);
  });

  // Lines logged while a size ran (a plugin's INFO, NCCL's lazy connections, a WARN with its
  // time) cut rows in two, glued to a row's last token (call 59's logs).
  it('reads rows cut by log lines, glued or not, and still reads those lines', () => {
    const log = [
      'vm:1902:1902 [0] NCCL INFO NET/Plugin: Loaded net plugin tsnet (v12)',
      '     2097152        524288     float     sum      -1  1200.00    1.75    1.75       0  1190.00    1.76    1.76       0',
      '  1073741824     134217728     float    none      -1vm:1902:1921 [0] NCCL INFO NET/tsnet busy-poll window of protocol thread 0: 512 us (22 wake-up(s), p90 < 128 us)',
      'vm:1903:1922 [0] NCCL INFO NET/tsnet busy-poll window of the I/O threads: 256 us (371 wake-up(s), p90 < 64 us)',
      '',
      '[2026-11-27 13:09:18] vm:1714:1786 [0] misc/socket.cc:964 NCCL WARN Call to shutdown failed: Transport endpoint is not connected',
      '  63242.0   16.98    8.49       0vm:1902:1921 [0] NCCL INFO NET/tsnet busy-poll window of the I/O threads: 512 us (87 wake-up(s), p90 < 128 us)',
      '  69104.0   15.54    7.77    N/A',
      '# Avg bus bandwidth    : 3.0396 ',
    ].join('\n');
    const p = parseLog(log);
    expect(p.rows.map((r) => [r.size, r.outOfPlace.busbw, r.outOfPlace.wrong, r.inPlace?.busbw])).toEqual([
      [2097152, 1.75, 0, 1.76],
      [1073741824, 8.49, 0, 7.77],
    ]);
    expect(p.avgBusbw).toBe(3.0396);
  });

  it('reads a log of docs/results/h200x2-engine: 2 ranks, 10 rows, no GDRDMA, no run.sh header', () => {
    const file = path.join(__dirname, '../../docs/results/h200x2-engine/logs/all_reduce_perf.mpi.tsnet.log');
    const p = parseLog(fs.readFileSync(file, 'utf8'));
    expect(p.ranks).toBe(2);
    expect(p.rows).toHaveLength(10);
    expect(p.declaredRanks).toBeNull();
    expect(p.transports).toEqual(['tcp']);
    expect(p.gdr.send.gdr + p.gdr.recv.gdr).toBe(0);
    expect(p.gdr.send.plain).toBeGreaterThan(0);
    expect(p.gdr.recv.plain).toBe(p.gdr.send.plain);
  });
});

describe('variants and ratio columns', () => {
  const all = ['tsnet-ofi-ipc', 'tsnet-ofi', 'tsnet-ofi-rails', 'tsnet-ofi-rails-comm', 'tsnet-ofi-host', 'tsnet', 'socket', 'socket-tuned'];

  it('orders the variants present in the known order, unknown ones last', () => {
    expect(orderVariants(['socket-tuned', 'tsnet', 'tsnet-ofi-host', 'socket'])).toEqual(['tsnet-ofi-host', 'tsnet', 'socket', 'socket-tuned']);
    expect(orderVariants([...all].reverse())).toEqual(all);
    expect(orderVariants(['zzz', 'socket', 'tsnet'])).toEqual(['tsnet', 'socket', 'zzz']);
  });

  it('keeps the three-variant report: tsnet against Socket and against Socket tuned', () => {
    expect(ratioColumns(['tsnet', 'socket', 'socket-tuned'])).toEqual([['tsnet', 'socket'], ['tsnet', 'socket-tuned']]);
  });

  it('puts every tsnet variant against Socket tuned, else Socket, and every ofi variant against tsnet', () => {
    expect(ratioColumns(all)).toEqual([
      ['tsnet-ofi-ipc', 'socket-tuned'],
      ['tsnet-ofi', 'socket-tuned'],
      ['tsnet-ofi-rails', 'socket-tuned'],
      ['tsnet-ofi-rails-comm', 'socket-tuned'],
      ['tsnet-ofi-host', 'socket-tuned'],
      ['tsnet', 'socket'],
      ['tsnet', 'socket-tuned'],
      ['tsnet-ofi-ipc', 'tsnet'],
      ['tsnet-ofi', 'tsnet'],
      ['tsnet-ofi-rails', 'tsnet'],
      ['tsnet-ofi-rails-comm', 'tsnet'],
      ['tsnet-ofi-host', 'tsnet'],
    ]);
    expect(ratioColumns(['tsnet-ofi', 'socket'])).toEqual([['tsnet-ofi', 'socket']]);
    expect(ratioColumns(['tsnet-ofi', 'tsnet'])).toEqual([['tsnet-ofi', 'tsnet']]);
    expect(ratioColumns(['socket', 'socket-tuned'])).toEqual([]);
  });

  it('writes one busbw column per variant present, then the ratios, under the mode heading', () => {
    const runs = [run('socket-tuned', { busbw: [1, 4] }), run('tsnet', { transport: 'tcp', busbw: [1, 2] }), run('tsnet-ofi', { busbw: [2, 3] })];
    const t = table(runs, 'all_reduce_perf', 'mpi1');
    expect(t[0]).toBe('### all_reduce_perf, 2 processes on one GPU (each its own NCCL host, MPS)');
    expect(t[2]).toBe('| size | ofi busbw | tsnet busbw | Socket tuned busbw | ofi / tuned | tsnet / tuned | ofi / tsnet |');
    expect(t[3]).toBe('|---:|---:|---:|---:|---:|---:|---:|');
    expect(t[5]).toBe('| 64 B | 3.00 | 2.00 | 4.00 | 0.75 | 0.50 | 1.50 |');
    expect(t.at(-2)).toContain('tsnet over ofi (GDR) 2.50, tsnet over TCP 1.50, Socket (4 threads x 4 sockets) 2.50');
  });

  it('names the modes with the ranks of the logs', () => {
    expect(modeHeading('g2', 2)).toBe('2 GPUs in one process (-g 2)');
    expect(modeHeading('g4', 4)).toBe('4 GPUs in one process (-g 4)');
    expect(modeHeading('mpi', 4)).toBe('4 processes under mpirun (one GPU each)');
    expect(modeHeading('mpi1', 3)).toBe('3 processes on one GPU (each its own NCCL host, MPS)');
  });
});

describe('checks', () => {
  it('writes the GDR cell: GDRDMA of all per direction, none, or no channel lines', () => {
    expect(gdrCell(run('tsnet-ofi', { channels: [GDR_SEND, GDR_SEND, GDR_RECV, PLAIN_RECV] }).gdr)).toBe('send 2/2, recv 1/2');
    expect(gdrCell(run('tsnet', { channels: [PLAIN_SEND, PLAIN_RECV] }).gdr)).toBe('none');
    expect(gdrCell(run('tsnet').gdr)).toBe('–');
  });

  it('passes runs that measured what their names say', () => {
    expect(problems(run('tsnet-ofi', { channels: [GDR_SEND, GDR_RECV] }))).toEqual([]);
    expect(problems(run('tsnet-ofi-host', { channels: [PLAIN_SEND, PLAIN_RECV] }))).toEqual([]);
    expect(problems(run('socket', { channels: [PLAIN_SEND, PLAIN_RECV] }))).toEqual([]);
  });

  it('only notes a GDR variant whose channels are not all GDRDMA', () => {
    const r = run('tsnet-ofi-ipc', { channels: [GDR_SEND, PLAIN_RECV] });
    expect(gdrNote(r)).toEqual({ text: 'not all channels GDRDMA', problem: false });
    expect(problems(r)).toEqual([]);
    expect(checksTable([r])[2]).toContain('| send 1/1, recv 0/1 (*not all channels GDRDMA*) |');
  });

  it('fails tsnet-ofi-host, tsnet-ofi-rails and tsnet-ofi-rails-comm with any GDRDMA channel', () => {
    const r = run('tsnet-ofi-host', { channels: [PLAIN_SEND, GDR_RECV] });
    expect(problems(r)).toEqual(['GDRDMA with GDR off (send 0/1, recv 1/1)']);
    expect(checksTable([r])[2]).toContain('(**GDRDMA with GDR off**)');
    expect(problems(run('tsnet-ofi-rails', { channels: [GDR_SEND, PLAIN_RECV] }))).toEqual(['GDRDMA with GDR off (send 1/1, recv 0/1)']);
    expect(problems(run('tsnet-ofi-rails', { channels: [PLAIN_SEND, PLAIN_RECV] }))).toEqual([]);
    expect(problems(run('tsnet-ofi-rails-comm', { channels: [GDR_SEND, PLAIN_RECV] }))).toEqual(['GDRDMA with GDR off (send 1/1, recv 0/1)']);
  });

  it('applies the tsnet checks to every tsnet variant, and the transport check to the ofi ones', () => {
    const notLoaded = toRun('all_reduce_perf.mpi1.tsnet-ofi', log({ net: 'Socket' }), { status: 0, seconds: 1 });
    expect(problems(notLoaded)).toEqual(['tsnet not loaded', 'tsnet not used']);
    expect(problems(run('tsnet-ofi-host', { transport: 'tcp' }))).toEqual(['tsnet ran over tcp, not ofi']);
  });

  it('fails runs that listed fewer ranks than run.sh asked for, exited non-zero or had wrong values', () => {
    expect(problems(run('socket', { ranks: [0, 0] }))).toEqual(['1 ranks listed, 2 asked for']);
    expect(problems(run('socket', { wrong: [0, 2] }))).toEqual(['#wrong 2']);
    expect(problems(toRun('all_reduce_perf.mpi1.socket', log({ net: 'Socket' }), { status: 2, seconds: 0 }))).toEqual(['exit 2']);
  });
});
