// The ABI model: what the inspector reads from plugin/abi/ and the emitters consume.

/** Where a definition sits, for `file:line: message` reports. */
export interface Loc {
  file: string;
  line: number;
}

/** A C type as the definitions spell it. */
export type CType =
  | { kind: 'void' }
  | { kind: 'scalar'; alias: string; c: string; field: string | null }
  | { kind: 'typedef'; alias: string }
  | { kind: 'struct'; name: string }
  | { kind: 'ptr'; to: CType; constTo: boolean };

/** One member of a struct. */
export interface MemberDef {
  name: string;
  doc: string;
  type: CType;
  /** Versions whose struct has the member. */
  versions: number[];
  /** Array length per version (absent: not an array). */
  lengths: Map<number, number> | null;
  /** Member holding how many array entries are used. */
  countedBy: string | null;
  loc: Loc;
}

/** A struct interface; versioned when any member or length differs per version. */
export interface StructDef {
  name: string;
  cname: string;
  doc: string;
  versions: number[];
  versioned: boolean;
  /** FieldKind name when the struct is a member of a described struct. */
  field: string | null;
  /** Emit a field-descriptor table for the neutral struct. */
  fields: boolean;
  members: MemberDef[];
  loc: Loc;
}

/** A parameter of a function type. */
export interface ParamDef {
  name: string;
  type: CType;
  loc: Loc;
}

/** A C function type (signature of a slot, or a callback typedef). */
export interface FnType {
  params: ParamDef[];
  ret: CType;
  variadic: boolean;
}

/** A `@count param by max`: an array parameter holding `by` entries, at most `max`. */
export interface CountDef {
  param: string;
  by: string;
  max: string;
}

/** A `@fill param expr`: the C expression an adapter passes for a core parameter its version lacks. */
export interface FillDef {
  param: string;
  expr: string;
}

/** One overload of a table slot. */
export interface Overload extends FnType {
  doc: string;
  versions: number[];
  core: boolean;
  counts: CountDef[];
  fills: FillDef[];
  loc: Loc;
}

/** One slot of the function table. */
export interface SlotDef {
  name: string;
  doc: string;
  /** Data slots (the name) hold a value instead of a function. */
  data: { type: CType; value: string; versions: number[] } | null;
  overloads: Overload[];
  absent: number[];
  unimplemented: boolean;
  loc: Loc;
}

/** The function table interface. */
export interface TableDef {
  name: string;
  cname: string;
  exportName: string;
  doc: string;
  slots: SlotDef[];
  loc: Loc;
}

/** A typedef: a named scalar (`@ctype`) or a function pointer. */
export interface TypedefDef {
  alias: string;
  cname: string;
  doc: string;
  scalar: string | null;
  fn: FnType | null;
  loc: Loc;
}

/** An enum of constants, emitted as `prefix + member`. */
export interface ConstGroup {
  name: string;
  doc: string;
  prefix: string;
  members: { name: string; value: number; doc: string; loc: Loc }[];
  loc: Loc;
}

/** Everything plugin/abi/ defines. */
export interface AbiModel {
  versions: number[];
  typedefs: TypedefDef[];
  structs: StructDef[];
  table: TableDef;
  constants: ConstGroup[];
}

/** The C prefix of the version-neutral core functions. */
export const CORE_PREFIX = 'tsn_';

/** camelCase → snake_case (getProperties → get_properties). */
export function snake(name: string): string {
  return name.replace(/[A-Z]/g, (c) => '_' + c.toLowerCase());
}

/** The core function a slot maps to (tsn_get_properties). */
export function coreName(slot: SlotDef): string {
  return CORE_PREFIX + snake(slot.name);
}

/** The overload of a slot that applies to a version, or null. */
export function overloadFor(slot: SlotDef, version: number): Overload | null {
  return slot.overloads.find((o) => o.versions.includes(version)) ?? null;
}

/** The core overload of a slot, or null. */
export function coreOf(slot: SlotDef): Overload | null {
  return slot.overloads.find((o) => o.core) ?? null;
}

/** Whether a version's table has the slot. */
export function slotIn(slot: SlotDef, version: number): boolean {
  return slot.data ? slot.data.versions.includes(version) : overloadFor(slot, version) !== null;
}

/** Struct by interface name. */
export function structNamed(model: AbiModel, name: string): StructDef {
  const s = model.structs.find((d) => d.name === name);
  if (!s) throw new Error(`no struct ${name}`);
  return s;
}

/** Members a version of a struct has (all members when version is null). */
export function membersIn(s: StructDef, version: number | null): MemberDef[] {
  return version === null ? s.members : s.members.filter((m) => m.versions.includes(version));
}

/** Array length of a member in a version (largest when version is null). */
export function lengthIn(m: MemberDef, version: number | null): number | null {
  if (!m.lengths) return null;
  if (version === null) return Math.max(...m.lengths.values());
  return m.lengths.get(version) ?? null;
}
