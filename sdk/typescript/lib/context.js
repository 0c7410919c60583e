// The `context` every operation and run command gets, with the seeds' members: `instance`,
// `state` (one plain object per process), `configuration`, `atom` (lock, slots, onassigned,
// meter), `local.<operation>(request, options)` and `remote.<component>.<operation>(...)`.

import { AsyncLocalStorage } from 'node:async_hooks'
import { Agent, refusal } from './agent.js'
import { CallError, abandoned, contract } from './errors.js'
import { CALL, CALL_HEADER, FAILED, LOCK, METER, ONASSIGNED, STASH_DELETE, STASH_GET, STASH_SET, TASK, TRACE_HEADERS, at } from './protocol.js'

/** The call an operation serves, through everything it awaits: `context.call`, and its id goes
 * with every call the operation makes (the `toa-call` header), so that the agent knows what
 * makes it.
 * @type {AsyncLocalStorage<CallInfo>} */
export const running = new AsyncLocalStorage()

/** The W3C trace context headers the operation's request came with (`traceparent`,
 * `tracestate`), through everything it awaits: passed on with every call and lock it makes, so
 * that they join its trace.
 * @type {AsyncLocalStorage<Record<string, string>>} */
export const traced = new AsyncLocalStorage()

/** The trace context headers of an operation's request, if it came with any.
 * @param {import('node:http').IncomingHttpHeaders} headers
 * @returns {Record<string, string> | undefined} */
export function traceOf (headers) {
  /** @type {Record<string, string>} */
  const trace = {}
  for (const name of TRACE_HEADERS) {
    const value = headers[name]
    if (typeof value === 'string' && value !== '') trace[name] = value
  }
  return Object.keys(trace).length ? trace : undefined
}

/** The headers of a call or lock the running operation makes: the id of the call it answers
 * and the trace context it was given; none outside an operation.
 * @returns {Record<string, string> | undefined} */
function madeIn () {
  const id = running.getStore()?.id
  const headers = { ...traced.getStore() }
  if (id !== undefined) headers[CALL_HEADER] = id
  return Object.keys(headers).length ? headers : undefined
}

/** @typedef {import('./protocol.js').Assignment} Assignment */
/** @typedef {import('./protocol.js').AssignedEvent} AssignedEvent */
/** @typedef {import('./protocol.js').LockEvent} LockEvent */
/** @typedef {import('./protocol.js').CallRequest} CallRequest */
/** @typedef {import('./protocol.js').Outcome} Outcome */
/** @typedef {import('./protocol.js').OperationError} OperationError */
/** @typedef {import('./protocol.js').MeterResponse} MeterResponse */
/** A held lock's signal. @typedef {AbortSignal & { readonly token: number, readonly error: unknown }} LockSignal */
/** @typedef {import('./protocol.js').CallInfo} CallInfo */
/** How long a call to one process waits; `discard: true` sends it as a task, answered `null` once the broker took it. @typedef {{ timeout?: number, signal?: AbortSignal, discard?: boolean }} CallOptions */
/** What a caller passes: the input, the process for a stateful operation, the object for an operation on one (`query: { id, version? }`), an idempotency key. @typedef {{ input?: unknown, instance?: string, query?: import('./protocol.js').Query, key?: string }} Request */

/** The fields a request and its options may have: any other is refused, naming it, before
 * anything is sent (the agent refuses it too, as do `toa-agent call` and the other SDK). */
const REQUEST = ['input', 'instance', 'query', 'key']
const OPTIONS = ['timeout', 'signal', 'discard']

/** `slots` answers null when nothing was heard from the agent for this long: it writes a line at
 * least every second (the assignment on a change, a keep-alive otherwise), so two seconds of
 * silence mean the agent, or the way to it, is stuck and the assignment may be stale. */
export const SILENCE_MS = 2000

/** A held lock's signal: a real `AbortSignal`, aborted when the lock is lost. `token` is the
 * fencing token (larger for every later holder); `error` is why it aborted (`signal.reason`). */
/** @param {AbortController} controller @param {number} token @returns {LockSignal} */
function lockSignal (controller, token) {
  const signal = controller.signal
  Object.defineProperty(signal, 'token', { value: token, enumerable: true })
  Object.defineProperty(signal, 'error', { get: () => signal.reason, enumerable: true })
  return /** @type {LockSignal} */ (signal)
}

/** Keeps this component's onassigned stream open until `stop()`: `onLine(event)` for each event,
 * and `onDown()` whenever the stream ends, cannot be opened, or falls silent for `SILENCE_MS` (it
 * is closed then: a half-open connection hears nothing more). Opened again 500 ms later. */
class Following {
  /** @param {Agent} agent @param {{ onLine: (event: AssignedEvent) => void, onDown: () => void }} handlers */
  constructor (agent, { onLine, onDown }) {
    this.agent = agent
    this.handlers = { onLine, onDown }
    this.heard = 0
    this.failing = false
    this.stopped = false
    /** @type {() => void} */
    this.close = () => {}
  }

  async run () {
    while (!this.stopped) {
      /** @type {NodeJS.Timeout | undefined} */
      let silence
      try {
        await new Promise((/** @type {(value?: unknown) => void} */ resolve, reject) => {
          this.heard = Date.now()
          silence = setInterval(() => { if (Date.now() - this.heard > SILENCE_MS) this.close() }, SILENCE_MS / 4)
          this.agent.stream(ONASSIGNED.method, this.agent.own(ONASSIGNED), undefined, {
            onLine: this.handlers.onLine,
            onAlive: () => { this.heard = Date.now() },
            onEnd: resolve
          }).then((close) => {
            this.close = close
            this.failing = false
            if (this.stopped) close()
          }, reject)
        })
      } catch (error) {
        // Once per outage, not every 500 ms.
        if (!this.failing) console.error(`${this.agent.component}: onassigned:`, /** @type {Error} */ (error).message)
        this.failing = true
      } finally {
        clearInterval(silence)
      }
      this.handlers.onDown()
      if (!this.stopped) await new Promise((resolve) => setTimeout(resolve, 500).unref())
    }
  }

  stop () {
    this.stopped = true
    this.close()
  }
}

/** The stream behind `slots`: the last assignment heard, and when a line was last heard. */
class Assignments {
  /** @param {Agent} agent */
  constructor (agent) {
    /** @type {Assignment | null} */
    this.value = null
    this.following = new Following(agent, {
      onLine: (event) => { this.value = event.assignment ?? null },
      onDown: () => { this.value = null }
    })
  }

  follow () {
    return this.following.run()
  }

  /** @param {number} total @returns {number[] | null} */
  slots (total) {
    if (this.value === null || Date.now() - this.following.heard > SILENCE_MS) return null
    const { i, n } = this.value
    const slots = []
    for (let slot = i; slot < total; slot += Math.max(n, 1)) slots.push(slot)
    return slots
  }

  stop () {
    this.following.stop()
  }
}

class Atom {
  /** @param {Agent} agent */
  constructor (agent) {
    this.agent = agent
    this.assignments = new Assignments(agent)
  }

  /** Runs `fn(signal)` while no other replica holds `keys` (a key or an array), waiting as long
   * as it takes; returns what `fn` returns. The lock goes when `fn` settles.
   * @template T
   * @param {string | string[]} keys
   * @param {(signal: LockSignal) => T | Promise<T>} fn
   * @returns {Promise<T>}
   */
  async lock (keys, fn) {
    keys = typeof keys === 'string' ? [keys] : [...keys]
    const controller = new AbortController()
    /** @type {{ resolve: (token: number) => void, reject: (error: Error) => void }} */
    let acquired = { resolve: () => {}, reject: () => {} }
    let released = false
    const held = new Promise((/** @type {(token: number) => void} */ resolve, reject) => { acquired = { resolve, reject } })
    /** @type {import('./protocol.js').LockRequest} */
    const body = { keys }
    // Asked for in an operation: the agent waits for it only until the call's deadline, and
    // then answers DEADLINE (the caller is told the call failed; `fn` must not run).
    const close = await this.agent.stream(LOCK.method, this.agent.own(LOCK), body, {
      headers: madeIn(),
      onLine: (/** @type {LockEvent} */ event) => {
        if (event.event === 'acquired') acquired.resolve(/** @type {number} */ (event.token))
        else if (event.event === 'lost') controller.abort(new Error(`the lock on ${keys.join(', ')} was lost`))
        else acquired.reject(new CallError({ code: event.code ?? 'LOCK', message: event.message ?? JSON.stringify(event) }))
      },
      onEnd: () => {
        if (released) return
        acquired.reject(new CallError({ code: 'LOCK', message: 'the agent closed the lock stream' }))
        controller.abort(new Error(`the lock on ${keys.join(', ')} was lost: the agent closed its stream`))
      }
    })
    try {
      const token = await held
      return await fn(lockSignal(controller, token))
    } finally {
      released = true
      close() // closing the request releases the lock
    }
  }

  /** This replica's share of `total` slots, or null while it owns none for sure.
   * @param {number} total
   */
  slots (total) {
    return this.assignments.slots(total)
  }

  /** Charges `deltas` to `keys` across replicas; each key's debt after the charge.
   * @param {string | string[]} keys
   * @param {number | number[]} deltas
   * @returns {Promise<number[]>}
   */
  async meter (keys, deltas) {
    /** @type {import('./protocol.js').MeterRequest} */
    const body = {
      keys: typeof keys === 'string' ? [keys] : [...keys],
      deltas: typeof deltas === 'number' ? [deltas] : [...deltas]
    }
    /** @type {MeterResponse} */
    const answer = await this.agent.checked(METER.method, this.agent.own(METER), body)
    return answer.debts
  }

  /** Calls `listener(assignment)` at once and on every change; returns `off`. A listener that
   * throws gives this replica's slots to the others.
   * @param {(assignment: Assignment | null) => void | Promise<void>} listener
   * @returns {() => void}
   */
  onassigned (listener) {
    return new Listening(this.agent, listener).off
  }
}

/** One `onassigned` listener: its own stream (the listener hears `null` while it is down: the
 * share is lost as far as this process can tell), calls one at a time, each only on a change. */
class Listening {
  /** @param {Agent} agent @param {(assignment: Assignment | null) => void | Promise<void>} listener */
  constructor (agent, listener) {
    this.agent = agent
    this.listener = listener
    /** @type {string | undefined} */
    this.told = undefined
    this.done = false
    this.calls = Promise.resolve()
    this.following = new Following(agent, {
      onLine: (event) => this.tell(event.assignment ?? null, event.listener),
      onDown: () => this.tell(null)
    })
    this.off = () => { this.done = true; this.following.stop() }
    this.following.run()
  }

  /** Queues a call of the listener with `assignment` if it differs from the last one told.
   * @param {Assignment | null} assignment
   * @param {number} [id] the listener's, as the agent named it
   */
  tell (assignment, id) {
    const key = JSON.stringify(assignment)
    if (this.done || key === this.told) return
    this.told = key
    this.calls = this.calls.then(async () => {
      if (this.done) return
      try {
        await this.listener(assignment)
      } catch (error) {
        console.error(`${this.agent.component}: an onassigned listener threw, this replica owns nothing from now on:`, error)
        this.done = true
        // Told while the stream is open: the agent knows the listener only until it closes.
        const { status } = await this.agent.request(FAILED.method, this.agent.own(FAILED, { listener: /** @type {number} */ (id) })).catch((/** @type {Error} */ e) => ({ status: e.message }))
        if (status !== 200) console.error(`${this.agent.component}: the agent was not told of the failed listener: ${status}`)
        this.following.stop()
      }
    })
  }
}

/** The stash: what every replica of the component should see (seed 001), kept for a time to
 * live the caller gives (ms, at most 30 days), on the first atomicity server (in-process locally
 * without one); not what must survive, which belongs in the entity. */
class Stash {
  /** @param {Agent} agent */
  constructor (agent) {
    this.agent = agent
  }

  /** @param {string} key */
  path (key) {
    return at(STASH_GET, { component: this.agent.component, key: encodeURIComponent(key) })
  }

  /** The value under `key`, or null. @param {string} key @returns {Promise<unknown>} */
  async get (key) {
    /** @type {import('./protocol.js').StashValue} */
    const answer = await this.agent.checked(STASH_GET.method, this.path(key))
    return answer.value ?? null
  }

  /** Keeps `value` (JSON, at most 1 MiB) under `key` for `ttl` ms, replacing what was there.
   * @param {string} key @param {unknown} value @param {number} ttl */
  async set (key, value, ttl) {
    if (value === undefined) throw new TypeError(`stash.set(${JSON.stringify(key)}): a value is required (delete removes one)`)
    if (!Number.isInteger(ttl)) throw new TypeError(`stash.set(${JSON.stringify(key)}): ttl (ms) is required, got ${ttl}`)
    /** @type {import('./protocol.js').StashRequest} */
    const body = { value, ttl }
    await this.agent.checked(STASH_SET.method, this.path(key), body)
  }

  /** Removes `key`; whether a value was kept. @param {string} key @returns {Promise<boolean>} */
  async delete (key) {
    /** @type {import('./protocol.js').StashDeleted} */
    const answer = await this.agent.checked(STASH_DELETE.method, this.path(key))
    return answer.deleted
  }
}

/** `remote.<a>.<b>...(request, options)`: the last name is the operation, the ones before it the
 * component's full name. A function behind a proxy, so that every name is a further step. */
/** @param {Agent} agent @param {string[]} path @returns {any} */
function calls (agent, path) {
  return new Proxy(function call () {}, {
    get (_, name) {
      // Not a thenable, and not a step for the runtime's own probing.
      if (typeof name !== 'string' || name === 'then') return undefined
      return calls(agent, [...path, name])
    },
    /** @param {any} _ @param {any} __ @param {[Request?, CallOptions?]} args */
    apply (_, __, [request = {}, options = {}]) {
      if (path.length < 2) throw new TypeError(`${path.join('.')}: name a component, then an operation`)
      return call(agent, path.slice(0, -1).join('.'), /** @type {string} */ (path.at(-1)), request, options)
    }
  })
}

/**
 * @param {Agent} agent
 * @param {string} component
 * @param {string} operation
 * @param {Request} request
 * @param {CallOptions} [options]
 * @returns {Promise<unknown>}
 */
async function call (agent, component, operation, request, options = {}) {
  const target = `${component}.${operation}`
  const { timeout, signal, discard = false } = options
  const unknown = [...unknownFields(request, REQUEST, 'request'), ...unknownFields(options, OPTIONS, 'option')]
  if (unknown.length) throw contract(`${target}: ${unknown.join('; ')}`)
  if (signal !== undefined && (request.instance === undefined || discard)) {
    throw contract(`${target}: only a call to one process (with instance) that waits for its answer states a signal`)
  }
  // Aborted before it is made: it is made nowhere.
  if (signal?.aborted) throw abandoned(`${target}: the signal was aborted before the call was made`)
  /** @type {CallRequest} */
  const body = { input: request.input ?? null }
  if (request.instance !== undefined) body.instance = request.instance
  if (timeout !== undefined) body.timeout = timeout
  if (request.query !== undefined) body.query = request.query
  if (request.key !== undefined) body.key = request.key
  let answer
  try {
    const route = discard ? TASK : CALL
    answer = await agent.request(route.method, at(route, { component, operation }), body, { signal, headers: madeIn() })
  } catch (error) {
    if (signal?.aborted) throw abandoned(`${target}: the signal ended the wait`)
    throw new CallError({ code: 'UNAVAILABLE', message: `${target}: the agent did not answer: ${/** @type {Error} */ (error).message}` })
  }
  const { status } = answer
  if (status >= 400) throw new CallError(refusal(answer.value, status))
  if (discard) return null
  /** @type {Outcome} */
  const value = answer.value
  if (value.error !== undefined) return operationError(value.error)
  return value.reply
}

/** What `given` holds beyond `known`, each named (`unknown request field \`qeury\``).
 * @param {object} given @param {string[]} known @param {string} what */
function unknownFields (given, known, what) {
  if (given === null || typeof given !== 'object') return [`expected the ${what}s as an object, got ${JSON.stringify(given)}`]
  return Object.keys(given).filter((field) => !known.includes(field))
    .map((field) => `unknown ${what} field \`${field}\` (known: ${known.join(', ')})`)
}

/** The operation's own error, as it returned it: an `Error` whose message is the code.
 * @param {OperationError} error
 */
function operationError ({ code, message }) {
  const error = /** @type {Error & { code: string, detail?: string }} */ (new Error(code))
  error.code = code
  if (message != null) error.detail = message
  return error
}

/** A string `"$NAME"` in the configuration is the place of a secret, whose value comes as
 * `TOA_SECRET_NAME` (docs/context.md, "Secrets"). */
const SECRET = /^\$([A-Z][A-Z0-9_]*)$/

/** `value` with every secret in place; throws naming one without a value, never a value.
 * @param {unknown} value
 * @param {NodeJS.ProcessEnv} env
 * @param {string} [at]
 * @returns {unknown}
 */
function reveal (value, env, at = '') {
  if (typeof value === 'string') {
    const name = SECRET.exec(value)?.[1]
    if (name === undefined) return value
    const secret = env[`TOA_SECRET_${name}`]
    if (secret === undefined) throw new Error(`TOA_CONFIGURATION${at}: the secret $${name} has no value: TOA_SECRET_${name} is not set`)
    return secret
  }
  if (Array.isArray(value)) return value.map((item, index) => reveal(item, env, `${at}/${index}`))
  if (value !== null && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, reveal(item, env, `${at}/${key}`)]))
  }
  return value
}

/**
 * @template [Local=any] `local`'s type (a component's generated types say which)
 * @template [Remote=any] `remote`'s type
 * @template [Configuration=any] `configuration`'s type
 */
export class Context {
  /** @param {NodeJS.ProcessEnv} [env] */
  constructor (env = process.env) {
    const agent = new Agent(env)
    Object.defineProperty(this, 'agent', { value: agent })
    this.instance = agent.instance
    /** One plain object per process, shared by run commands and operations. @type {Record<string, any>} */
    this.state = {}
    let configuration
    try {
      configuration = JSON.parse(env.TOA_CONFIGURATION || '{}')
    } catch (error) {
      throw new Error(`TOA_CONFIGURATION: expected the component's configuration as JSON: ${/** @type {Error} */ (error).message}`)
    }
    /** @type {Configuration} */
    this.configuration = /** @type {Configuration} */ (reveal(configuration, env))
    this.atom = new Atom(agent)
    this.stash = new Stash(agent)
    /** @type {Local} */
    this.local = calls(agent, [agent.component])
    /** @type {Remote} */
    this.remote = calls(agent, [])
  }

  /** The call the running operation answers: `{ id, redelivered, deadline_ms }` as the agent
   * says it (the same `id` on every delivery; `deadline_ms` when its caller stops waiting, ms
   * since the epoch); `undefined` in a run command.
   * @returns {CallInfo | undefined} */
  get call () {
    return running.getStore()
  }
}
