// Logging through NCCL's logger (the binding), with the NET subsystem so that
// NCCL_DEBUG_SUBSYS=NET selects it. Before the binding is there (unit tests), WARN goes
// to stderr and the rest is dropped. Never stdout.
import { LogLevel, LogSubsys } from './abi';

export type LogFn = (level: number, flags: number, msg: string) => void;

let sink: LogFn = (level, _flags, msg) => {
  if (level === LogLevel.WARN) process.stderr.write(`NET/tsnet WARN ${msg}\n`);
};
let traceOn = false;

export function setLogSink(fn: LogFn, trace = false): void {
  sink = fn;
  traceOn = trace;
}

export const log = {
  warn: (msg: string) => sink(LogLevel.WARN, LogSubsys.NET | LogSubsys.INIT, msg),
  info: (msg: string, subsys: number = LogSubsys.NET) => sink(LogLevel.INFO, subsys, msg),
  /** Only when NCCL_DEBUG=TRACE: keeps the data path free of string building otherwise. */
  trace: (msg: () => string) => {
    if (traceOn) sink(LogLevel.TRACE, LogSubsys.NET, msg());
  },
};
