// The agent's local API (docs/component-protocol.md), for one component: the requests the context
// makes. The component's token (TOA_AGENT_TOKEN, or the file TOA_AGENT_TOKEN_FILE names, read for
// each request: an agent container restarted by the kubelet writes a new one) goes with every one.

import { readFileSync } from 'node:fs'
import http from 'node:http'
import { CallError } from './errors.js'
import { at } from './protocol.js'

/** @typedef {import('./protocol.js').Route} Route */
/** @typedef {import('./protocol.js').ErrorBody} ErrorBody */

/**
 * An answer: its status and JSON value (a non-JSON body as an error naming the status); a stream
 * that opened (status 200) as its response and request instead.
 * @typedef {{ status: number, value: any, response?: undefined, request?: undefined }
 *   | { status: 200, value?: undefined, response: http.IncomingMessage, request: http.ClientRequest }} Answer
 */

/**
 * @typedef {object} StreamHandlers
 * @property {(event: any) => void} onLine each non-blank line, parsed
 * @property {() => void} [onAlive] every line (blank ones are keep-alives)
 * @property {() => void} [onEnd] once it ends
 * @property {Record<string, string>} [headers] sent with the request
 */

export class Agent {
  /** @param {NodeJS.ProcessEnv} env */
  constructor (env = process.env) {
    if (!env.TOA_AGENT || !env.TOA_COMPONENT) {
      throw new Error('expected TOA_AGENT (the agent\'s local API, e.g. http://127.0.0.1:7090) and TOA_COMPONENT: a component\'s program is started by toa-agent, which sets them')
    }
    const url = new URL(env.TOA_AGENT)
    this.host = url.hostname
    this.port = Number(url.port)
    this.component = env.TOA_COMPONENT
    this.instance = env.TOA_INSTANCE ?? ''
    this.token = env.TOA_AGENT_TOKEN
    this.tokenFile = env.TOA_AGENT_TOKEN_FILE
    // Calls reuse connections; streams (lock, onassigned) get their own.
    this.pool = new http.Agent({ keepAlive: true })
  }

  headers () {
    /** @type {Record<string, string>} */
    const headers = { 'content-type': 'application/json' }
    const token = readToken(this.token, this.tokenFile)
    if (token) headers.authorization = `Bearer ${token}`
    return headers
  }

  /** One of the component's own routes (`/v1/{component}/...`).
   * @param {Route} route
   * @param {Record<string, string | number>} [parameters] the others than `component`
   */
  own (route, parameters = {}) {
    return at(route, { ...parameters, component: this.component })
  }

  /** The answer's status and JSON value. `signal` ends the wait (the request is dropped).
   * @param {string} method
   * @param {string} path
   * @param {object} [body]
   * @param {{ signal?: AbortSignal, stream?: boolean, headers?: Record<string, string> }} [options]
   * @returns {Promise<Answer>}
   */
  request (method, path, body, { signal, stream = false, headers = {} } = {}) {
    return new Promise((resolve, reject) => {
      const request = http.request({
        host: this.host,
        port: this.port,
        method,
        path,
        headers: { ...this.headers(), ...headers },
        agent: stream ? false : this.pool,
        signal
      }, (response) => {
        if (stream && response.statusCode === 200) return resolve({ status: 200, response, request })
        /** @type {Buffer[]} */
        const chunks = []
        response.on('data', (chunk) => chunks.push(chunk))
        response.on('end', () => {
          const text = Buffer.concat(chunks).toString()
          let value = null
          try { value = text ? JSON.parse(text) : null } catch { value = { error: { code: String(response.statusCode), message: text } } }
          resolve({ status: /** @type {number} */ (response.statusCode), value })
        })
        response.on('error', reject)
      })
      request.setNoDelay(true)
      request.on('error', reject)
      request.end(body === undefined ? undefined : JSON.stringify(body))
    })
  }

  /** The answer's value; a 4xx or 5xx is a `CallError`.
   * @param {string} method
   * @param {string} path
   * @param {object} [body]
   * @returns {Promise<any>}
   */
  async checked (method, path, body) {
    const { status, value } = await this.request(method, path, body)
    if (status >= 400) throw new CallError(refusal(value, status))
    return value
  }

  /** An open stream of JSON lines: `onLine(event)` for each non-blank line, `onAlive()` for every
   * line (blank ones are the agent's keep-alives), `onEnd()` once it ends. Resolves once open,
   * to a function that closes it.
   * @param {string} method
   * @param {string} path
   * @param {object | undefined} body
   * @param {StreamHandlers} handlers
   * @returns {Promise<() => void>}
   */
  async stream (method, path, body, { onLine, onAlive = () => {}, onEnd = () => {}, headers }) {
    const answer = await this.request(method, path, body, { stream: true, headers })
    if (answer.response === undefined) throw new CallError(refusal(answer.value, answer.status))
    const { response, request } = answer
    let rest = ''
    let ended = false
    const end = () => { if (!ended) { ended = true; onEnd() } }
    response.setEncoding('utf8')
    response.on('data', (/** @type {string} */ chunk) => {
      const lines = (rest + chunk).split('\n')
      rest = lines.pop() ?? ''
      for (const line of lines) {
        onAlive()
        if (!line.trim()) continue
        let event
        try {
          event = JSON.parse(line)
        } catch {
          event = null
        }
        if (event === null || typeof event !== 'object') {
          // Not the agent's protocol: end the stream rather than act on it.
          console.error(`${this.component}: ${path}: not a JSON object, the stream is closed: ${line.slice(0, 200)}`)
          request.destroy()
          return
        }
        onLine(event)
      }
    })
    response.on('end', end)
    response.on('error', end)
    request.on('close', end)
    return () => request.destroy()
  }
}

/** The component's token: `token` (TOA_AGENT_TOKEN), else the file `tokenFile`
 * (TOA_AGENT_TOKEN_FILE) names, read now (an agent container the kubelet restarted writes a new
 * one); undefined without either. The agent's requests to the program carry it too.
 * @param {string | undefined} token @param {string | undefined} tokenFile
 * @returns {string | undefined}
 */
export function readToken (token, tokenFile) {
  if (token === undefined && tokenFile) token = readFileSync(tokenFile, 'utf8').trim()
  return token || undefined
}

/** The agent's refusal in a 4xx or 5xx answer's body, or its status when it has none.
 * @param {ErrorBody | null | undefined} value
 * @param {number} status
 * @returns {import('./protocol.js').ErrorDetail}
 */
export function refusal (value, status) {
  return value?.error ?? { code: String(status) }
}
