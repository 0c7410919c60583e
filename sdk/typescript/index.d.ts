// The types a component written with toa-component sees. A component's own `types/index.d.ts`
// (`toa-node types`) narrows `Context` with its operations, its neighbours and its configuration.
/// <reference types="node" />

/** This replica is number `i` of `n`: it owns the slots `i, i + n, i + 2n, …` below a total. */
export interface Assignment {
  i: number
  n: number
  epoch: number
}

/** The signal a lock's function gets: aborted when the lock is lost (stop touching what it
 * guards). `token` is the fencing token, larger for every later holder; `error` is why it was
 * aborted (`reason`). */
export interface LockSignal extends AbortSignal {
  readonly token: number
  readonly error: unknown
}

export interface Atom {
  /** Runs `fn` while no other replica holds `keys`, waiting as long as it takes. */
  lock<T> (keys: string | string[], fn: (signal: LockSignal) => T | Promise<T>): Promise<T>
  /** This replica's share of `total` slots, or null while it owns none for sure. */
  slots (total: number): number[] | null
  /** Calls `listener` at once and on every change; returns `off`. */
  onassigned (listener: (assignment: Assignment | null) => void | Promise<void>): () => void
  /** Charges `deltas` (ms) to `keys` across replicas; each key's debt after the charge. */
  meter (keys: string[], deltas: number[]): Promise<number[]>
}

/** What every replica should see (seed 001), for a time to live: not what must survive. */
export interface Stash {
  /** The value under `key`, or null (never set, expired or deleted). */
  get (key: string): Promise<unknown>
  /** Keeps `value` (JSON, at most 1 MiB) under `key` for `ttl` ms (at most 30 days). */
  set (key: string, value: unknown, ttl: number): Promise<void>
  /** Removes `key`; whether a value was kept. */
  delete (key: string): Promise<boolean>
}

/** How a call is made. `discard: true` sends it as a task (seed 002's `{ discard: true }`): the
 * promise resolves to `null` once the broker took it, and the operation runs later. */
export interface TaskOptions {
  discard?: boolean
}

/** How long a call to one process waits: `timeout` (ms) or until `signal` aborts. */
export interface CallOptions extends TaskOptions {
  timeout?: number
  signal?: AbortSignal
}

/** The call an operation answers, as the agent says it: the same `id` on every delivery,
 * `redelivered` when it was delivered before, `deadline_ms` when the agent stops waiting for
 * this run (ms since the epoch: the caller's deadline for a call to one process, else the run's
 * limit; an agent before this one left it `null` for ordinary calls). */
export interface CallInfo {
  id?: string
  redelivered?: boolean
  deadline_ms?: number | null
}

/** The `context` every operation and run command gets (the runtime constructs it from the
 * variables the agent starts the program with: `env`, by default `process.env`). */
export declare class Context<Local = any, Remote = any, Configuration = any> {
  constructor (env?: NodeJS.ProcessEnv)
  /** This process's name. */
  readonly instance: string
  /** One plain object per process, shared by run commands and operations. */
  state: Record<string, any>
  configuration: Configuration
  atom: Atom
  stash: Stash
  local: Local
  remote: Remote
  /** The call the running operation answers; `undefined` in a run command. */
  readonly call: CallInfo | undefined
}

/** An operation's own error, as its caller gets it (returned, not thrown): `code` is one of the
 * codes the operation declares (`errors:`), `detail` its message. A component's generated types
 * name each operation's (`<Operation>Error`). */
export interface OperationError<Code extends string = string> extends Error {
  code: Code
  detail?: string
}

/** A call that failed as a call: `code` 403 (Addressee), 404 (Abandoned), 202 (RequestContract),
 * otherwise the agent's code; `name` is the agent's code. */
export declare class CallError extends Error {
  /** `error` as the agent answers it: `{"code", "number"?, "message"?}`. */
  constructor (error: { code: string, number?: number | null, message?: string })
  code: number | string
}
