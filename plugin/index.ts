// The plugin's entry, loaded by the embedded Node of every protocol thread. It routes console
// output to NCCL's logger (a guest never prints to stdout), keeps stray exceptions from
// stopping the plugin, and hands the binding its two handlers.
import { LogLevel } from './abi';
import { Port } from './engine/port';
import { log, setLogSink } from './log';
import type { Binding } from './native';
import { Plugin } from './plugin';
import { readProcessCpu, readThreadsCpu } from './stats';
import { makeTransport } from './transports';
import { setAscendingCopy } from './arrays';
import { setClock } from './clock';
import { randomBytes } from 'node:crypto';
import { setFdNote } from './errors';

const binding = (process as unknown as { _linkedBinding(name: string): Binding })._linkedBinding('tsnet');
// OpenSSL initialises itself at its first use and registers its exit-time cleanup then. Used
// once here, at load, it does so before embed/host.cc registers the handler that stops tsnet's
// threads when the process exits; exit handlers run newest first, so that one runs first.
randomBytes(1);
setClock(() => binding.monoMs());
setAscendingCopy(binding.copyAscending);
if (binding.fdNote) setFdNote(binding.fdNote);

const debug = (process.env.NCCL_DEBUG ?? '').toUpperCase();
setLogSink((level, flags, msg) => binding.log(level, flags, msg), debug === 'TRACE');

const toLog = (level: number) => (...args: unknown[]) => binding.log(level, 16, args.map(String).join(' '));
Object.assign(console, {
  log: toLog(LogLevel.INFO),
  info: toLog(LogLevel.INFO),
  debug: toLog(LogLevel.TRACE),
  warn: toLog(LogLevel.WARN),
  error: toLog(LogLevel.WARN),
});

process.on('uncaughtException', (e) => log.warn(`uncaught exception in the plugin: ${e?.stack ?? e}`));
process.on('unhandledRejection', (e) => log.warn(`unhandled rejection in the plugin: ${(e as Error)?.stack ?? e}`));

let started: ReturnType<Binding['start']>;
let engine: Port | undefined; // this thread's port, once a transport asked for it
const plugin = new Plugin({
  thread: binding.thread,
  get mailbox() { return started.mailbox; },
  get recordStride() { return started.recordStride; },
  get slotsPerComm() { return started.slotsPerComm; },
  startThreads: (n) => binding.startThreads(n),
  setSpin: (us) => binding.setSpin(us),
  makeTransport: (config, regions) => {
    const port = () => {
      const p = Port.get(binding, { ioThreads: config.ioThreads, spinUs: config.spinUs, lingerMs: config.timeoutSec * 1000, pollUs: config.pollUs, writeNowMax: config.directSendMax, directIdleUs: config.directIdleUs, earlyWake: config.earlyWake });
      if (config.traceFile || config.statsSteps) binding.ioTrace(true);
      engine = p;
      return p;
    };
    return makeTransport(config, regions, binding, port, binding.thread);
  },
  threadCpu: () => binding.threadCpu(),
  sentHere: () => (engine ? { here: engine.writtenHere, part: engine.writtenPart } : undefined),
  busy: () => binding.busy(),
  longest: () => binding.longest(),
  runWait: () => binding.runWait(),
  earlyWakes: () => binding.earlyWakes(),
  controlCalls: () => binding.controlCalls(),
  ioCpu: () => Array.from(binding.ioStats()),
  ioWakes: () => binding.ioWakes(),
  processCpu: () => ({ threads: readThreadsCpu(), processUs: readProcessCpu() }),
  wakes: () => binding.wakes(),
  wakeState: () => binding.wakeState(),
  wakeSelf: () => binding.wakeSelf(),
  ioSetSpin: (us) => binding.ioSetSpin(us),
  traceOpen: (p) => binding.traceOpen(p),
  traceWrite: (t) => binding.traceWrite(t),
  now: () => binding.now(),
  timestamps: () => binding.timestamps(),
});
started = binding.start({
  control: (op, args) => plugin.control(op, args),
  turn: (count) => plugin.turn(count),
});
