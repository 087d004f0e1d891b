// Problems in plugin/abi/, reported as `file:line: message`.
import type { Loc } from './model';

/** One problem found while reading or validating the definitions. */
export interface Diagnostic extends Loc {
  message: string;
}

/** Formats a diagnostic the way compilers do. */
export function formatDiagnostic(d: Diagnostic): string {
  return `${d.file}:${d.line}: ${d.message}`;
}

/** Thrown when the definitions have problems; carries all of them. */
export class AbiError extends Error {
  constructor(readonly diagnostics: Diagnostic[]) {
    super(diagnostics.map(formatDiagnostic).join('\n'));
    this.name = 'AbiError';
  }
}

/** Collects diagnostics while a pass runs. */
export class Reporter {
  readonly diagnostics: Diagnostic[] = [];
  error(loc: Loc, message: string): void {
    this.diagnostics.push({ ...loc, message });
  }
  /** Throws an AbiError when anything was reported. */
  throwIfAny(): void {
    if (this.diagnostics.length > 0) throw new AbiError(this.diagnostics);
  }
}
