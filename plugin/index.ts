// The plugin's entry, loaded by the embedded Node on the plugin thread. It routes console
// output to NCCL's logger (a guest never prints to stdout), keeps stray exceptions from
// stopping the plugin, and hands the binding its two handlers.
import { LogLevel } from './abi';
import { log, setLogSink } from './log';
import type { Binding } from './native';
import { Plugin, makeTransport } from './plugin';

const binding = (process as unknown as { _linkedBinding(name: string): Binding })._linkedBinding('tsnet');

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

const plugin = new Plugin(
  (comm, slot, result, sizes) => binding.complete(comm, slot, result, ...sizes),
  (config) => makeTransport(config, binding),
  process.env,
  (config) => binding.setSpin(config.spinUs),
);
const started = binding.start({
  control: (op, args) => plugin.control(op, args),
  data: (count) => plugin.data(started.mailbox, count, started.recordStride, started.recordHead),
});
