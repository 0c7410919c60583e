// The agent's protocol as this SDK speaks it (agent/openapi.yaml, docs/component-protocol.md):
// the routes it calls or serves and the bodies it sends and reads, as JSDoc types the rest of the
// SDK is checked against (`tsc`, tsconfig.json). Each route's field maps below are plain data
// that `tsc` checks to hold exactly the keys of its types (`Fields`), so that
// `sdk/test_protocol.py` can compare them with agent/openapi.yaml (and list what is lacking).

/** The variables the agent starts the program with (docs/component-protocol.md). */
export const ENVIRONMENT = /** @type {const} */ ([
  'TOA_PORT',
  'TOA_AGENT',
  'TOA_COMPONENT',
  'TOA_INSTANCE',
  'TOA_AGENT_TOKEN',
  'TOA_AGENT_TOKEN_FILE',
  'TOA_CONFIGURATION',
  'TOA_SECRET_{NAME}'
])

/** @typedef {{ code: string, number?: number | null, message?: string }} ErrorDetail */
/** The agent's refusal, with a 4xx or 5xx status. @typedef {{ error?: ErrorDetail }} ErrorBody */
/** @typedef {{ code: string, message?: string | null }} OperationError */
/** An operation's answer: `reply`, or its own `error`. @typedef {{ reply?: unknown, error?: OperationError }} Outcome */
/** A transition's answer: the entry as the function left it and what it returned (no `reply`: the entry itself), or its own `error`. @typedef {{ reply?: unknown, error?: OperationError, entry?: Record<string, unknown> }} Decision */
/** The object a call works on, and the version the caller saw. @typedef {{ id?: string, version?: number }} Query */

/** @typedef {{ keys: string[] }} LockRequest */
/** `code` on an error: `DEADLINE` when the call the lock was asked for ran out of time first. @typedef {{ event?: 'acquired' | 'lost' | 'error', token?: number, code?: string, message?: string }} LockEvent */
/** This replica is number `i` of `n` (owning the slots i, i + n, ...). @typedef {{ i: number, n: number, epoch: number }} Assignment */
/** @typedef {{ listener?: number, assignment?: Assignment | null }} AssignedEvent */
/** @typedef {{ keys: string[], deltas: number[] }} MeterRequest */
/** @typedef {{ debts: number[] }} MeterResponse */
/** @typedef {{ input: unknown, instance?: string, timeout?: number, query?: Query, key?: string }} CallRequest */
/** @typedef {{ halt: string }} Halt */
/** The stash's value under a key (`null`: none kept). @typedef {{ value: unknown }} StashValue */
/** A value to keep, for `ttl` ms. @typedef {{ value: unknown, ttl: number }} StashRequest */
/** @typedef {{ deleted: boolean }} StashDeleted */

/** `GET /program`: the run commands the program exports and the operations it serves; the events whose receiver's request it makes and those whose condition it keeps (when there are any). @typedef {{ commands: string[], operations: string[], kinds: Record<string, string>, receivers?: string[], conditions?: string[] }} Description */
/** What the agent says of a call: the same `id` on every delivery; `redelivered` when it was delivered before; `deadline_ms` when the agent stops waiting for this run (ms since the epoch: the caller's deadline, or the run's limit). @typedef {{ id?: string, redelivered?: boolean, deadline_ms?: number | null }} CallInfo */
/** @typedef {{ input?: unknown, entry?: Record<string, unknown> | null, call?: CallInfo }} OperationRequest */
/** `POST /receivers/<label>`: the event, as published. @typedef {{ payload: Record<string, unknown> }} AdaptRequest */
/** The request an event makes of its receiver's operation. @typedef {{ input?: unknown, query?: Query, instance?: string }} Adapted */
/** @typedef {{ request: Adapted }} Adaptation */
/** `POST /conditions`: the object as a write stores it (with `id` and `VERSION`), and as it was (`null`: there was none). @typedef {{ entry: Record<string, unknown>, previous: Record<string, unknown> | null }} ConditionsRequest */
/** The names of the events whose condition holds for the write. @typedef {{ publish: string[] }} Publish */

/**
 * A type's keys, each `true`, or the nested object's keys for an object (not an array, not a
 * map of any keys): a field map of exactly those keys.
 * @template T
 * @typedef {{ [K in keyof T]-?: NonNullable<T[K]> extends readonly unknown[] ? true : string extends keyof NonNullable<T[K]> ? true : NonNullable<T[K]> extends Record<string, unknown> ? Fields<NonNullable<T[K]>> : true }} Fields
 */

/**
 * @typedef {object} Route
 * @property {'GET' | 'POST' | 'PUT' | 'DELETE'} method
 * @property {string} path its `{parameters}` are the path's parameters
 * @property {string[]} [query]
 * @property {string[]} [headers]
 * @property {object} [request] the request body's fields
 * @property {object} [response] a 2xx answer's fields
 * @property {object} [error] a 4xx or 5xx answer's fields
 */

/** @satisfies {Fields<ErrorBody>} */
const error = { error: { code: true, number: true, message: true } }
/** @satisfies {Fields<Outcome>} */
const outcome = { reply: true, error: { code: true, message: true } }
/** @satisfies {Fields<CallRequest>} */
const callRequest = { input: true, instance: true, timeout: true, key: true, query: { id: true, version: true } }
/** @satisfies {Fields<Halt>} */
const halt = { halt: true }

// The component's own routes take its token.
const own = ['Authorization']

/** The stash (what every replica should see), one key at a time. */
const STASH_PATH = '/v1/{component}/stash/{key}'
/** @satisfies {Route} */
export const STASH_GET = { method: 'GET', path: STASH_PATH, headers: own, response: /** @satisfies {Fields<StashValue>} */ ({ value: true }), error }
/** @satisfies {Route} */
export const STASH_SET = { method: 'PUT', path: STASH_PATH, headers: own, request: /** @satisfies {Fields<StashRequest>} */ ({ value: true, ttl: true }), error }
/** @satisfies {Route} */
export const STASH_DELETE = { method: 'DELETE', path: STASH_PATH, headers: own, response: /** @satisfies {Fields<StashDeleted>} */ ({ deleted: true }), error }

/** The running call's id, on the calls and locks an operation asks for (toa-context's
 * `program::CallHeaders`): the agent refuses a call from a transition that retries to an
 * operation declaring `once`, and waits for a lock only until the call's deadline. */
export const CALL_HEADER = 'toa-call'

/** W3C trace context: the agent sends it with an operation's request; the program passes it on,
 * as it came, with every call and lock the operation makes, so they join the caller's trace. */
export const TRACE_HEADERS = ['traceparent', 'tracestate']

/** @satisfies {Route} */
export const LOCK = {
  method: 'POST',
  path: '/v1/{component}/lock',
  headers: [...own, CALL_HEADER, ...TRACE_HEADERS],
  request: /** @satisfies {Fields<LockRequest>} */ ({ keys: true }),
  response: /** @satisfies {Fields<LockEvent>} */ ({ event: true, token: true, code: true, message: true }),
  error
}
/** @satisfies {Route} */
export const ONASSIGNED = {
  method: 'GET',
  path: '/v1/{component}/onassigned',
  headers: own,
  response: /** @satisfies {Fields<AssignedEvent>} */ ({ listener: true, assignment: { i: true, n: true, epoch: true } }),
  error
}
/** @satisfies {Route} */
export const FAILED = { method: 'POST', path: '/v1/{component}/onassigned/{listener}/failed', headers: own }
/** @satisfies {Route} */
export const METER = {
  method: 'POST',
  path: '/v1/{component}/meter',
  headers: own,
  request: /** @satisfies {Fields<MeterRequest>} */ ({ keys: true, deltas: true }),
  response: /** @satisfies {Fields<MeterResponse>} */ ({ debts: true }),
  error
}
/** @satisfies {Route} */
export const CALL = { method: 'POST', path: '/v1/call/{component}/{operation}', headers: [CALL_HEADER, ...TRACE_HEADERS], request: callRequest, response: outcome, error }
/** A task: the same request as a call, answered once the broker took it (`{"reply": null}`). */
/** @satisfies {Route} */
export const TASK = { method: 'POST', path: '/v1/task/{component}/{operation}', headers: [CALL_HEADER, ...TRACE_HEADERS], request: callRequest, error }
/** @satisfies {Route} */
export const READYZ = { method: 'GET', path: '/readyz' }
/** @satisfies {Route} */
export const DRAIN = { method: 'POST', path: '/v1/drain' }
// The program's side.
/** @satisfies {Route} */
export const PROGRAM = {
  method: 'GET',
  path: '/program',
  headers: ['Authorization'],
  response: /** @satisfies {Fields<Description>} */ ({ commands: true, operations: true, kinds: true, receivers: true, conditions: true })
}
/** @satisfies {Route} */
export const LIFECYCLE = { method: 'POST', path: '/lifecycle/{command}', headers: ['Authorization'] }
/** @satisfies {Route} */
export const OPERATIONS = {
  method: 'POST',
  path: '/operations/{name}',
  headers: ['Authorization', ...TRACE_HEADERS],
  request: /** @satisfies {Fields<OperationRequest>} */ ({ input: true, entry: true, call: { id: true, redelivered: true, deadline_ms: true } }),
  response: /** @satisfies {Fields<Decision>} */ ({ ...outcome, entry: true })
}
/** @satisfies {Route} */
export const RECEIVERS = {
  method: 'POST',
  path: '/receivers/{label}',
  headers: ['Authorization'],
  request: /** @satisfies {Fields<AdaptRequest>} */ ({ payload: true }),
  response: /** @satisfies {Fields<Adaptation>} */ ({ request: { input: true, query: { id: true, version: true }, instance: true } })
}
/** @satisfies {Route} */
export const CONDITIONS = {
  method: 'POST',
  path: '/conditions',
  headers: ['Authorization'],
  request: /** @satisfies {Fields<ConditionsRequest>} */ ({ entry: true, previous: true }),
  response: /** @satisfies {Fields<Publish>} */ ({ publish: true })
}
// The control endpoint, as the stage uses it (the token itself, not a signature).
/** @satisfies {Route} */
export const HALT = { method: 'POST', path: '/control/halt', headers: ['Authorization'], request: halt }
/** @satisfies {Route} */
export const RESUME = { method: 'POST', path: '/control/resume', headers: ['Authorization'], request: halt }

export const ROUTES = [LOCK, ONASSIGNED, FAILED, METER, STASH_GET, STASH_SET, STASH_DELETE, CALL, TASK, READYZ, DRAIN, PROGRAM, LIFECYCLE, OPERATIONS, RECEIVERS, CONDITIONS, HALT, RESUME]

/** `route`'s path with its parameters in place.
 * @param {Route} route
 * @param {Record<string, string | number>} parameters
 */
export function at (route, parameters) {
  return route.path.replace(/\{(\w+)\}/g, (_, name) => String(parameters[name]))
}
