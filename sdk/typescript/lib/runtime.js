// The component's program: loads `operations/*` and `rc/*` (TypeScript or JavaScript) from the
// component's directory (the directory the program starts in), refuses to start when a module is
// not what it should be, and serves the agent's protocol on 127.0.0.1:$TOA_PORT:
//
// - `GET /program`: `{"commands", "operations", "kinds"}`, what the modules export; the agent
//   checks it against the manifest and runs the exported run commands;
// - `POST /lifecycle/<command>`: every rc/ module's function of that name, in file-name order;
// - `POST /operations/<name>`: the module's function, with `input` (and, in a component with an
//   entity, a transition's or an observation's `entry`) and the context. A transition answers
//   the entry as it left it and what it returned (nothing when it returned the entry itself);
// - `POST /receivers/<label>`: `request(payload)` of `receivers/<label>.ts` (seed 001's
//   adaptation of an event to its receiver's request: `input`, `query`, `instance`);
// - `POST /conditions`: `condition(entry, previous)` of every `events/<name>.ts`, for a write
//   about to be stored: the names of the events whose condition holds, which the write publishes.

import { readdirSync } from 'node:fs'
import http from 'node:http'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { timingSafeEqual } from 'node:crypto'
import { readToken } from './agent.js'
import { Context, running, traceOf, traced } from './context.js'
import { CONDITIONS, PROGRAM } from './protocol.js'

/** @typedef {(input: any, ...rest: any[]) => unknown} Operation */
/** @typedef {(context: Context) => unknown} Command */
/** @typedef {(payload: any) => unknown} Adaptation */
/** @typedef {(entry: any, previous: any) => unknown} Condition */
/** @typedef {{ operations: Map<string, Operation>, kinds: Map<string, string>, commands: Map<string, Command[]>, receivers?: Map<string, Adaptation>, conditions?: Map<string, Condition> }} Modules */
/** @typedef {import('./protocol.js').Outcome} Outcome */
/** @typedef {import('./protocol.js').OperationRequest} OperationRequest */

export const COMMANDS = ['preflight', 'settle', 'ready', 'pause', 'resume', 'dispose']
export const KINDS = ['effect', 'computation', 'transition', 'observation', 'assignment']
const SOURCES = /\.(ts|mts|js|mjs)$/

/** A component that must not start, and why. */
export class Refused extends Error {}

/** @param {string} directory */
function sources (directory) {
  try {
    return readdirSync(directory).filter((name) => SOURCES.test(name) && !name.endsWith('.d.ts')).sort()
  } catch (error) {
    if (/** @type {NodeJS.ErrnoException} */ (error).code === 'ENOENT') return []
    throw error
  }
}

/** The operations (name → function) and run commands (name → functions) in `directory`.
 * @param {string} directory
 * @returns {Promise<Modules>}
 */
export async function load (directory) {
  /** @type {Modules['operations']} */
  const operations = new Map()
  /** @type {Modules['kinds']} */
  const kinds = new Map()
  for (const file of sources(join(directory, 'operations'))) {
    const module = await import(pathToFileURL(join(directory, 'operations', file)).href)
    const exported = KINDS.filter((kind) => typeof module[kind] === 'function')
    if (exported.length !== 1) {
      throw new Refused(`operations/${file}: expected one exported function named ${KINDS.join(' or ')}, found ${exported.length ? exported.join(', ') : 'none'}`)
    }
    const name = file.replace(SOURCES, '')
    if (operations.has(name)) throw new Refused(`operations/${file}: a second module for the operation ${name}`)
    operations.set(name, module[exported[0]])
    kinds.set(name, exported[0])
  }
  /** @type {Modules['commands']} */
  const commands = new Map()
  for (const file of sources(join(directory, 'rc'))) {
    const module = await import(pathToFileURL(join(directory, 'rc', file)).href)
    const exported = COMMANDS.filter((name) => typeof module[name] === 'function')
    if (exported.length === 0) throw new Refused(`rc/${file}: a module exports at least one of ${COMMANDS.join(', ')}`)
    for (const name of exported) commands.set(name, [...(commands.get(name) ?? []), module[name]])
  }
  if (commands.has('pause') && !commands.has('resume')) {
    throw new Refused('rc/ exports `pause` and no `resume`: resume takes again what pause released')
  }
  const receivers = await exported(directory, 'receivers', 'request', 'request(payload)')
  const conditions = await exported(directory, 'events', 'condition', 'condition(entry, previous)')
  return { operations, kinds, commands, receivers, conditions }
}

/** The function `name` each module of `directory/folder` exports, by the module's name (an
 * event's label for receivers/, its name for events/).
 * @param {string} directory @param {string} folder @param {string} name @param {string} signature
 * @returns {Promise<Map<string, (...args: any[]) => unknown>>}
 */
async function exported (directory, folder, name, signature) {
  const functions = new Map()
  for (const file of sources(join(directory, folder))) {
    const module = await import(pathToFileURL(join(directory, folder, file)).href)
    if (typeof module[name] !== 'function') throw new Refused(`${folder}/${file}: expected a function named ${signature}`)
    functions.set(file.replace(SOURCES, ''), module[name])
  }
  return functions
}

export class Component {
  /** @param {Modules} modules @param {Context} context */
  constructor ({ operations, kinds = new Map(), commands, receivers = new Map(), conditions = new Map() }, context) {
    this.operations = operations
    this.kinds = kinds
    this.commands = commands
    this.receivers = receivers
    this.conditions = conditions
    this.context = context
  }

  /** @returns {import('./protocol.js').Description} */
  description () {
    /** @type {import('./protocol.js').Description} */
    const description = {
      commands: COMMANDS.filter((name) => this.commands.has(name)),
      operations: [...this.operations.keys()].sort(),
      kinds: Object.fromEntries(this.kinds)
    }
    if (this.receivers.size) description.receivers = [...this.receivers.keys()].sort()
    if (this.conditions.size) description.conditions = [...this.conditions.keys()].sort()
    return description
  }

  /** The request the event `label` makes: what `request(payload)` returns, passed as it is (the
   * agent dead-letters an event whose request is not an object of input, query and instance:
   * another delivery would make the same).
   * @param {string} label @param {unknown} payload
   * @returns {Promise<import('./protocol.js').Adaptation>}
   */
  async adapt (label, payload) {
    const adaptation = /** @type {Adaptation} */ (this.receivers.get(label))
    return { request: /** @type {import('./protocol.js').Adapted} */ (await adaptation(payload)) }
  }

  /** The events whose condition holds for a write that stores `entry` over `previous` (`null`:
   * there was none). A condition answers true or false; anything else fails the write (a
   * condition that forgot to return would otherwise never publish).
   * @param {unknown} entry @param {unknown} previous
   * @returns {Promise<import('./protocol.js').Publish>}
   */
  async publish (entry, previous) {
    const publish = []
    for (const name of [...this.conditions.keys()].sort()) {
      const holds = await /** @type {Condition} */ (this.conditions.get(name))(entry, previous ?? null)
      if (typeof holds !== 'boolean') throw new TypeError(`events/${name}: condition returned ${holds === null ? 'null' : typeof holds}, expected true or false`)
      if (holds) publish.push(name)
    }
    return { publish }
  }

  /** @param {string} name */
  async lifecycle (name) {
    for (const fn of this.commands.get(name) ?? []) await fn(this.context)
  }

  /** `{reply}` or the operation's own `{error}`; a thrown exception is a failure. With an
   * `entry` (a component with an entity) the function is given it before the context, and a
   * transition answers the entry as it left it too.
   * @param {string} name
   * @param {unknown} input
   * @param {Record<string, unknown> | null} [entry]
   * @returns {Promise<import('./protocol.js').Decision>}
   */
  async operate (name, input, entry) {
    const fn = /** @type {Operation} */ (this.operations.get(name))
    const result = await (entry === undefined ? fn(input, this.context) : fn(input, entry, this.context))
    if (result instanceof Error) {
      const own = /** @type {Error & { code?: unknown }} */ (result)
      const code = typeof own.code === 'string' ? own.code : result.message
      /** @type {import('./protocol.js').OperationError} */
      const error = { code }
      if (code !== result.message) error.message = result.message
      return { error }
    }
    if (this.kinds.get(name) !== 'transition' || entry == null) return { reply: result ?? null }
    // The entry itself returned: the agent answers the stored object, with its new VERSION.
    if (result === entry) return { entry }
    return { entry, reply: result ?? null }
  }
}

/** @param {http.ServerResponse} response @param {number} status @param {unknown} value */
function answer (response, status, value) {
  const body = JSON.stringify(value)
  response.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) })
  response.end(body)
}

const PAST_DEADLINE = "the call's deadline passed before the operation started; it did not run"

/** Whether the caller has stopped waiting (`deadline_ms`, ms since the epoch): it was answered
 * `Abandoned` at its deadline, so the operation must not start after it. Checked right before the
 * operation, after the hand-off from the agent, which takes time of its own.
 * @param {OperationRequest['call']} call
 */
function pastDeadline (call) {
  const deadline = call?.deadline_ms
  return typeof deadline === 'number' && Date.now() >= deadline
}

/** @param {http.IncomingMessage} request @returns {Promise<OperationRequest & Partial<import('./protocol.js').AdaptRequest> & Partial<import('./protocol.js').ConditionsRequest>>} */
async function body (request) {
  /** @type {Buffer[]} */
  const chunks = []
  for await (const chunk of request) chunks.push(chunk)
  const text = Buffer.concat(chunks).toString()
  return text ? JSON.parse(text) : {}
}

/** What a failure is called in its answer (the stack goes to the log only: the agent passes the
 * message on to the caller). */
/** @param {unknown} error */
function describe (error) {
  try {
    return error instanceof Error ? `${error.name}: ${error.message}` : String(error)
  } catch {
    return 'a value that cannot be printed was thrown'
  }
}

/** Whether `request` carries the component's token, as the agent's do; a program that knows no
 * token (started by hand) takes every request.
 * @param {http.IncomingMessage} request
 */
function fromTheAgent (request) {
  const expected = readToken(process.env.TOA_AGENT_TOKEN, process.env.TOA_AGENT_TOKEN_FILE)
  if (expected === undefined) return true
  const given = Buffer.from(request.headers.authorization ?? '')
  const wanted = Buffer.from(`Bearer ${expected}`)
  return given.length === wanted.length && timingSafeEqual(given, wanted)
}

/** @param {Component} component @param {string} [name] @returns {http.RequestListener} */
export function handler (component, name = process.env.TOA_COMPONENT) {
  // Not an `error` body: the agent would take that for an operation's own error.
  const unknown = (/** @type {http.ServerResponse} */ response, /** @type {string} */ url) => answer(response, 404, { message: `no route ${url}` })
  return async (request, response) => {
    if (!fromTheAgent(request)) {
      response.setHeader('connection', 'close')
      return answer(response, 401, { message: 'only the agent asks this program: its requests carry the component\'s token (Authorization: Bearer)' })
    }
    const url = /** @type {string} */ (request.url)
    const [kind, operation] = url.split('/').filter(Boolean)
    if (request.method === 'GET') {
      if (url === PROGRAM.path) return answer(response, 200, component.description())
      return unknown(response, url)
    }
    let input, entry, call, payload, previous
    try {
      ({ input, entry, call, payload, previous } = await body(request))
    } catch (error) {
      return answer(response, 400, { message: `expected a JSON body: ${describe(error)}` })
    }
    try {
      if (kind === 'lifecycle' && COMMANDS.includes(operation)) {
        await component.lifecycle(operation)
        return answer(response, 200, {})
      }
      if (kind === 'operations' && component.operations.has(operation)) {
        if (pastDeadline(call)) return answer(response, 504, { message: PAST_DEADLINE })
        const trace = traceOf(request.headers)
        const operate = () => component.operate(operation, input ?? null, entry)
        const run = trace === undefined ? operate : () => traced.run(trace, operate)
        const known = typeof call?.id === 'string' && call.id !== '' ? call : undefined
        return answer(response, 200, await (known === undefined ? run() : running.run(known, run)))
      }
      if (kind === 'receivers' && component.receivers.has(operation)) {
        return answer(response, 200, await component.adapt(operation, payload))
      }
      if (url === CONDITIONS.path && component.conditions.size) {
        return answer(response, 200, await component.publish(entry, previous))
      }
      return unknown(response, url)
    } catch (error) {
      console.error(`${name}: ${kind} ${operation ?? ''} failed:`, error)
      // A receiver's adaptation and a condition hold an event's data, which the message may
      // quote: the type only (the log above has the whole).
      const holdsData = kind === 'receivers' || kind === 'conditions'
      const message = holdsData ? `${error instanceof Error ? error.name : typeof error} (its message is in the program's log)` : describe(error)
      return answer(response, 500, { message })
    }
  }
}

/** Loads the component in the current directory and serves it; exits 1 naming what is wrong.
 * @param {NodeJS.ProcessEnv} [env]
 */
export async function main (env = process.env) {
  const name = env.TOA_COMPONENT ?? process.cwd()
  /** @type {(message: unknown) => never} */
  const refuse = (message) => {
    console.error(`${name}: ${message}`)
    process.exit(1)
  }
  const port = Number(env.TOA_PORT)
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    refuse(`TOA_PORT: expected the port to serve on, got ${JSON.stringify(env.TOA_PORT)}: a component's program is started by toa-agent, which sets it`)
  }
  /** @type {Modules} */
  let modules
  /** @type {Context} */
  let context
  try {
    modules = await load(process.cwd())
    context = new Context(env)
  } catch (error) {
    refuse(error instanceof Refused ? error.message : /** @type {Error | undefined} */ (error)?.stack ?? error)
  }
  // A promise a component left unhandled (a timer's poll that failed) is logged, not fatal.
  process.on('unhandledRejection', (reason) => console.error(`${name}: unhandled rejection:`, reason))
  const component = new Component(modules, context)
  const server = http.createServer({ noDelay: true, keepAliveTimeout: 60_000 }, handler(component, name))
  server.on('error', (error) => refuse(`cannot serve 127.0.0.1:${port}: ${error.message}`))
  context.atom.assignments.follow()
  server.listen(port, '127.0.0.1')
  // The agent stops the program with SIGTERM, after `dispose`. Ctrl-C on `toa-agent compose`
  // reaches the program too (one process group): it is the agent's to act on, so that the
  // program is still there for `dispose`.
  process.on('SIGINT', () => {})
  process.once('SIGTERM', () => {
    context.atom.assignments.stop()
    server.close()
    server.closeAllConnections()
  })
  return server
}
