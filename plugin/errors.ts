// The one place where failures become ncclResult_t codes. Everything the plugin throws is a
// NetError (with its code) or an unexpected exception (an internal error); Node's system
// errors (ECONNRESET, EPIPE, ...) are system errors.
import { ResultCode } from './abi';

export class NetError extends Error {
  constructor(readonly code: ResultCode, message: string) {
    super(message);
    this.name = 'NetError';
  }
}

/** NCCL or the caller passed something out of range. */
export const invalidArgument = (msg: string) => new NetError(ResultCode.INVALID_ARGUMENT, msg);
/** The user asked for something impossible (a send larger than its receive, ...). */
export const invalidUsage = (msg: string) => new NetError(ResultCode.INVALID_USAGE, msg);
/** The network or the OS failed. */
export const systemError = (msg: string) => new NetError(ResultCode.SYSTEM_ERROR, msg);
/** The peer failed or went away. */
export const remoteError = (msg: string) => new NetError(ResultCode.REMOTE_ERROR, msg);
/** The plugin or NCCL broke a rule of the interface. */
export const internalError = (msg: string) => new NetError(ResultCode.INTERNAL_ERROR, msg);

// The engine's words on a process out of file descriptors (its fdNote: the limit, and what to
// do), for the errors of Node's own sockets; set once the engine is loaded.
let fdNote: (code: string) => string = () => '';
export function setFdNote(note: (code: string) => string): void {
  fdNote = note;
}

/** For code EMFILE or ENFILE: the open-file limit the process ran into and what to do; else "". */
export const descriptorNote = (code: string): string => fdNote(code);

/**
 * A system error's message; when its code is EMFILE or ENFILE, with the open-file limit the
 * process ran into and what to do about it (unless the engine's error says so already).
 */
export function sysMessage(e: Error): string {
  const code = (e as NodeJS.ErrnoException).code;
  if ((code !== 'EMFILE' && code !== 'ENFILE') || /\((EMFILE|ENFILE): /.test(e.message)) return e.message;
  return e.message + fdNote(code);
}

/** The code and message NCCL sees for any thrown value. */
export function resultOf(e: unknown): { code: ResultCode; message: string } {
  if (e instanceof NetError) return { code: e.code, message: e.message };
  if (e instanceof Error) {
    const sys = (e as NodeJS.ErrnoException).code;
    if (typeof sys === 'string' && /^E(?!RR_)[A-Z0-9_]+$/.test(sys)) return { code: ResultCode.SYSTEM_ERROR, message: sysMessage(e) };
    return { code: ResultCode.INTERNAL_ERROR, message: e.stack ?? e.message };
  }
  return { code: ResultCode.INTERNAL_ERROR, message: String(e) };
}
