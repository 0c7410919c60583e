// A stage for a component author's own tests (seed 001: "In a test, stage.halt() and
// stage.restore() run pause and resume"): the real agent, `toa-agent compose`, on the author's
// components, with its local API and control endpoint on free loopback ports.

import { spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, writeFileSync } from 'node:fs'
import http from 'node:http'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { refusal } from './agent.js'
import { CallError } from './errors.js'
import { CALL, DRAIN, HALT, READYZ, RESUME, at } from './protocol.js'

/** @typedef {import('./protocol.js').Route} Route */
/** @typedef {import('./protocol.js').CallRequest} CallRequest */
/** @typedef {import('./protocol.js').Outcome} Outcome */
/** @typedef {{ code: number | string | null, signal?: NodeJS.Signals | null }} Exit */

const READY_WITHIN_MS = 60_000

/** A port on loopback nobody listens on now.
 * @returns {Promise<number>}
 */
export function freePort () {
  return new Promise((resolve, reject) => {
    const server = createServer()
    server.on('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const { port } = /** @type {import('node:net').AddressInfo} */ (server.address())
      server.close(() => resolve(port))
    })
  })
}

/**
 * @param {number} port
 * @param {string} method
 * @param {string} path
 * @param {object} [body]
 * @param {Record<string, string>} [headers]
 * @returns {Promise<{ status: number, value: any }>}
 */
function request (port, method, path, body, headers = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method, path, headers: { 'content-type': 'application/json', ...headers }, timeout: 120_000 }, (res) => {
      /** @type {Buffer[]} */
      const chunks = []
      res.on('data', (chunk) => chunks.push(chunk))
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString()
        let value = text
        try { value = text ? JSON.parse(text) : null } catch { /* /readyz and /v1/drain answer text */ }
        resolve({ status: /** @type {number} */ (res.statusCode), value })
      })
    })
    req.on('error', reject)
    req.on('timeout', () => req.destroy(new Error(`${method} ${path}: no answer within 120 s`)))
    req.end(body === undefined ? undefined : JSON.stringify(body))
  })
}

class Stage {
  /**
   * @param {import('node:child_process').ChildProcessByStdio<null, import('node:stream').Readable, import('node:stream').Readable>} child
   * @param {number} port
   * @param {number} control
   * @param {string} token
   */
  constructor (child, port, control, token) {
    this.child = child
    this.port = port
    this.control = control
    this.token = token
    this.address = `http://127.0.0.1:${port}`
    /** @type {Buffer[]} */
    this.log = []
    this.halts = 0
    /** @type {string | undefined} */
    this.halt_ = undefined
    /** @type {Promise<Exit>} */
    this.exited = new Promise((resolve) => {
      child.once('exit', (code, signal) => resolve({ code, signal }))
      child.once('error', (error) => resolve({ code: error.message }))
    })
    child.stdout.on('data', (chunk) => this.log.push(chunk))
    child.stderr.on('data', (chunk) => this.log.push(chunk))
  }

  output () {
    return Buffer.concat(this.log).toString()
  }

  async ready () {
    const deadline = Date.now() + READY_WITHIN_MS
    /** @type {{ exit: Exit | null }} */
    const exited = { exit: null }
    this.exited.then((status) => { exited.exit = status })
    while (Date.now() < deadline) {
      const exit = exited.exit
      if (exit) throw new Error(`toa-agent exited (${exit.code ?? exit.signal}) before it was ready:\n${this.output()}`)
      const answer = await request(this.port, READYZ.method, READYZ.path).catch(() => null)
      if (answer?.status === 200) return this
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    this.child.kill('SIGKILL')
    throw new Error(`toa-agent was not ready within ${READY_WITHIN_MS} ms:\n${this.output()}`)
  }

  /** @param {string} target @param {Partial<CallRequest>} [request_] */
  async call (target, request_ = {}) {
    const dot = target.lastIndexOf('.')
    /** @type {CallRequest} */
    const body = { input: null, ...request_ }
    const { status, value: answer } = await request(this.port, CALL.method, at(CALL, { component: target.slice(0, dot), operation: target.slice(dot + 1) }), body)
    if (status >= 400) throw new CallError(refusal(answer, status))
    /** @type {Outcome} */
    const value = answer
    if (value.error !== undefined) return Object.assign(new Error(value.error.code), value.error)
    return value.reply
  }

  /** @param {Route} route @param {string | undefined} halt */
  async controlled (route, halt) {
    /** @type {import('./protocol.js').Halt} */
    const body = { halt: /** @type {string} */ (halt) }
    const { status, value } = await request(this.control, route.method, route.path, body, { authorization: `Bearer ${this.token}` })
    if (status !== 200) throw new Error(`${route.path.split('/').at(-1)} answered ${status}: ${JSON.stringify(value)}`)
  }

  async halt () {
    this.halt_ = `stage-${++this.halts}`
    await this.controlled(HALT, this.halt_)
  }

  async restore () {
    await this.controlled(RESUME, this.halt_)
  }

  async stop () {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      const drained = await request(this.port, DRAIN.method, DRAIN.path).catch(() => null)
      // A drain the agent refused (or could not be asked): SIGTERM drains too.
      if (drained?.status !== 200) this.child.kill('SIGTERM')
    }
    return this.exited
  }
}

/** Starts `toa-agent compose` on `components`; resolves once every component is ready.
 * @param {string[]} components
 * @param {{ context?: string, environment?: string, env?: Record<string, string>, agent?: string }} [options]
 */
export async function compose (components, { context, environment, env = {}, agent } = {}) {
  const binary = agent ?? process.env.TOA_AGENT_BIN ?? 'toa-agent'
  const [port, control] = [await freePort(), await freePort()]
  const token = randomBytes(24).toString('hex')
  const tokenFile = join(mkdtempSync(join(tmpdir(), 'toa-stage-')), 'token')
  writeFileSync(tokenFile, token, { mode: 0o600 })
  const args = ['compose', ...components, '--listen', `127.0.0.1:${port}`,
    '--control-listen', `127.0.0.1:${control}`, '--control-token-file', tokenFile]
  if (context) args.push('--context', context)
  if (environment) args.push('--environment', environment)
  const child = spawn(binary, args, {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  return await new Stage(child, port, control, token).ready()
}
