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
import { CallError } from './errors.js'

const READY_WITHIN_MS = 60_000

/** A port on loopback nobody listens on now. */
export function freePort () {
  return new Promise((resolve, reject) => {
    const server = createServer()
    server.on('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address()
      server.close(() => resolve(port))
    })
  })
}

function request (port, method, path, body, headers = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method, path, headers: { 'content-type': 'application/json', ...headers }, timeout: 120_000 }, (res) => {
      const chunks = []
      res.on('data', (chunk) => chunks.push(chunk))
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString()
        let value = text
        try { value = text ? JSON.parse(text) : null } catch { /* /readyz and /v1/drain answer text */ }
        resolve({ status: res.statusCode, value })
      })
    })
    req.on('error', reject)
    req.on('timeout', () => req.destroy(new Error(`${method} ${path}: no answer within 120 s`)))
    req.end(body === undefined ? undefined : JSON.stringify(body))
  })
}

class Stage {
  constructor (child, port, control, token) {
    this.child = child
    this.port = port
    this.control = control
    this.token = token
    this.address = `http://127.0.0.1:${port}`
    this.log = []
    this.halts = 0
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
    let exited = null
    this.exited.then((status) => { exited = status })
    while (Date.now() < deadline) {
      if (exited) throw new Error(`toa-agent exited (${exited.code ?? exited.signal}) before it was ready:\n${this.output()}`)
      const answer = await request(this.port, 'GET', '/readyz').catch(() => null)
      if (answer?.status === 200) return this
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    this.child.kill('SIGKILL')
    throw new Error(`toa-agent was not ready within ${READY_WITHIN_MS} ms:\n${this.output()}`)
  }

  async call (target, request_ = {}) {
    const dot = target.lastIndexOf('.')
    const { status, value } = await request(this.port, 'POST', `/v1/call/${target.slice(0, dot)}/${target.slice(dot + 1)}`, { input: null, ...request_ })
    if (status >= 400) throw new CallError(value?.error ?? { code: String(status) })
    if (value.error !== undefined) return Object.assign(new Error(value.error.code), value.error)
    return value.reply
  }

  async controlled (route, halt) {
    const { status, value } = await request(this.control, 'POST', `/control/${route}`, { halt }, { authorization: `Bearer ${this.token}` })
    if (status !== 200) throw new Error(`${route} answered ${status}: ${JSON.stringify(value)}`)
  }

  async halt () {
    this.halt_ = `stage-${++this.halts}`
    await this.controlled('halt', this.halt_)
  }

  async restore () {
    await this.controlled('resume', this.halt_)
  }

  async stop () {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      const drained = await request(this.port, 'POST', '/v1/drain').catch(() => null)
      // A drain the agent refused (or could not be asked): SIGTERM drains too.
      if (drained?.status !== 200) this.child.kill('SIGTERM')
    }
    return this.exited
  }
}

/** Starts `toa-agent compose` on `components`; resolves once every component is ready. */
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
