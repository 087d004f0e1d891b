// Reads nccl-tests output: the result rows, the average bus bandwidth, the ranks, and what
// NCCL said about the network it loaded and used and whether its channels use GPUDirect.
export interface Half {
  timeUs: number;
  algbw: number;
  busbw: number;
  wrong: number | null; // null: not checked (N/A)
}

export interface Row {
  size: number;
  count: number;
  type: string;
  redop: string;
  outOfPlace: Half;
  inPlace: Half | null;
}

/** NCCL's network channel lines of one direction: with `/GDRDMA` (GPU buffers handed to the
 * plugin) and without (NCCL stages through host memory). */
export interface ChannelCount {
  gdr: number;
  plain: number;
}

export interface Parsed {
  rows: Row[];
  /** How many ranks nccl-tests listed (`#  Rank  N Group ...`), distinct rank numbers: 1 when
   * every process of an mpirun run calls itself rank 0 (nccl-tests built without MPI). */
  ranks: number;
  /** run.sh's `# ranks: N` header (the ranks it asked for); null in older logs. */
  declaredRanks: number | null;
  /** run.sh's `# mode: ...` header (g2 .. g8, mpi, mpi1); null in older logs. */
  declaredMode: string | null;
  /** Transports tsnet said it runs (`NET/tsnet config: transport = X`), distinct. */
  transports: string[];
  gdr: { send: ChannelCount; recv: ChannelCount };
  avgBusbw: number | null;
  /** Lines where NCCL says which net plugin it loaded and which network it uses. */
  loaded: string[];
  using: string[];
  warnings: string[];
  /** True when NCCL (or nccl-tests) reported an error. */
  failed: boolean;
}

const num = (s: string | undefined) => (s === undefined || s === 'N/A' ? NaN : Number(s));

function half(t: string[]): Half | null {
  if (t.length < 4) return null;
  const [time, algbw, busbw, wrong] = t;
  if (!Number.isFinite(num(time))) return null;
  return { timeUs: num(time), algbw: num(algbw), busbw: num(busbw), wrong: wrong === 'N/A' ? null : num(wrong) };
}

/**
 * The log's text without NCCL's log lines, wherever one starts ("host:pid:tid [dev] NCCL INFO
 * ..." to the end of its line, a WARN's "\n[time] " before it): the hosts are those of the lines
 * that start with one, so that a row's last token glued to a line ("-1vm:12:13 [0] NCCL ...")
 * stays with the row.
 */
function withoutLogLines(text: string): string {
  const hosts = new Set<string>();
  for (const m of text.matchAll(/^(?:\[[^\]\n]*\] )?([^\s:[\]]+):\d+:\d+ \[\d+\] /gm)) hosts.add(m[1]);
  if (!hosts.size) return text;
  const names = [...hosts].map((h) => h.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('|');
  // NCCL writes a WARN as "\\n[time] host:pid:tid [dev] file:line NCCL WARN ...": its newline goes too.
  return text.replace(new RegExp(`(?:\\n?\\[[^\\]\\n]*\\] )?(?:${names}):\\d+:\\d+ \\[\\d+\\] [^\\n]*(?:\\n|$)`, 'g'), '');
}

export function parseLog(text: string): Parsed {
  const rows: Row[] = [];
  let avgBusbw: number | null = null;
  const loaded: string[] = [];
  const using: string[] = [];
  const warnings: string[] = [];
  const rankIds = new Set<number>();
  let declaredRanks: number | null = null;
  let declaredMode: string | null = null;
  const transports = new Set<string>();
  const gdr = { send: { gdr: 0, plain: 0 }, recv: { gdr: 0, plain: 0 } };
  let failed = false;
  // A row whose collective logged meanwhile (NCCL's lazy connections, a plugin's line) is cut by
  // those lines: the rows are read with every log line taken out, so its pieces join again.
  for (const line of withoutLogLines(text).split('\n')) {
    const t = line.trim().split(/\s+/);
    if (/^\d+$/.test(t[0] ?? '') && /^\d+$/.test(t[1] ?? '') && t.length >= 9) {
      const oop = half(t.slice(5, 9));
      if (oop) rows.push({ size: Number(t[0]), count: Number(t[1]), type: t[2], redop: t[3], outOfPlace: oop, inPlace: half(t.slice(9, 13)) });
    }
  }
  for (const line of text.split('\n')) {
    const rank = /^#\s+Rank\s+(\d+)\s+Group\b/.exec(line);
    if (rank) rankIds.add(Number(rank[1]));
    const header = /^# (ranks|mode): (\S+)/.exec(line);
    if (header?.[1] === 'ranks') declaredRanks = Number(header[2]);
    if (header?.[1] === 'mode') declaredMode = header[2];
    const transport = /NET\/tsnet config: transport = (\w+)/.exec(line);
    if (transport) transports.add(transport[1]);
    // NCCL: "Channel 00/0 : 0[0] -> 1[0] [send] via NET/tsnet/0/GDRDMA" (then /Shared, ...)
    const channel = /\[(send|receive)\] via NET\/[^/\s]+\/(\S+)/.exec(line);
    if (channel) {
      const c = channel[1] === 'send' ? gdr.send : gdr.recv;
      if (channel[2].split('/').includes('GDRDMA')) c.gdr++;
      else c.plain++;
    }
    const avg = /Avg bus bandwidth\s*:\s*([\d.]+)/.exec(line);
    if (avg) avgBusbw = Number(avg[1]);
    if (/Loaded net plugin|NET\/Plugin/.test(line)) loaded.push(line.trim());
    if (/Using network/.test(line)) using.push(line.trim());
    if (/ WARN /.test(line)) warnings.push(line.trim());
    if (/NCCL failure|Test failure|unhandled system error|internal error/i.test(line)) failed = true;
    const oob = /Out of bounds values\s*:\s*(\d+)/.exec(line);
    if (oob && Number(oob[1]) !== 0) failed = true;
  }
  return { rows, ranks: rankIds.size, declaredRanks, declaredMode, transports: [...transports], gdr, avgBusbw, loaded, using, warnings, failed };
}

/** Every row's #wrong summed (out-of-place and in-place); NaN rows count as unchecked. */
export function wrongTotal(rows: Row[]): number {
  let n = 0;
  for (const r of rows) for (const h of [r.outOfPlace, r.inPlace]) if (h && h.wrong !== null && Number.isFinite(h.wrong)) n += h.wrong;
  return n;
}
