// The component's program: loads `operations/*` and `rc/*` (TypeScript or JavaScript) from the
// component's directory (the directory the program starts in), refuses to start when a module is
// not what it should be, and serves the agent's protocol on 127.0.0.1:$TOA_PORT:
//
// - `GET /program`: `{"commands", "operations"}`, what the modules export; the agent checks it
//   against the manifest and runs the exported run commands;
// - `POST /lifecycle/<command>`: every rc/ module's function of that name, in file-name order;
// - `POST /operations/<name>`: the module's function, with `input` and the context.

import { readdirSync } from 'node:fs'
import http from 'node:http'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { Context } from './context.js'

export const COMMANDS = ['preflight', 'settle', 'ready', 'pause', 'resume', 'dispose']
export const KINDS = ['effect', 'computation', 'transition', 'observation', 'assignment']
const SOURCES = /\.(ts|mts|js|mjs)$/

/** A component that must not start, and why. */
export class Refused extends Error {}

function sources (directory) {
  try {
    return readdirSync(directory).filter((name) => SOURCES.test(name) && !name.endsWith('.d.ts')).sort()
  } catch (error) {
    if (error.code === 'ENOENT') return []
    throw error
  }
}

/** The operations (name → function) and run commands (name → functions) in `directory`. */
export async function load (directory) {
  const operations = new Map()
  for (const file of sources(join(directory, 'operations'))) {
    const module = await import(pathToFileURL(join(directory, 'operations', file)).href)
    const kinds = KINDS.filter((kind) => typeof module[kind] === 'function')
    if (kinds.length !== 1) {
      throw new Refused(`operations/${file}: expected one exported function named ${KINDS.join(' or ')}, found ${kinds.length ? kinds.join(', ') : 'none'}`)
    }
    const name = file.replace(SOURCES, '')
    if (operations.has(name)) throw new Refused(`operations/${file}: a second module for the operation ${name}`)
    operations.set(name, module[kinds[0]])
  }
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
  return { operations, commands }
}

export class Component {
  constructor ({ operations, commands }, context) {
    this.operations = operations
    this.commands = commands
    this.context = context
  }

  description () {
    return {
      commands: COMMANDS.filter((name) => this.commands.has(name)),
      operations: [...this.operations.keys()].sort()
    }
  }

  async lifecycle (name) {
    for (const fn of this.commands.get(name) ?? []) await fn(this.context)
  }

  /** `{reply}` or the operation's own `{error}`; a thrown exception is a failure. */
  async operate (name, input) {
    const result = await this.operations.get(name)(input, this.context)
    if (result instanceof Error) {
      const code = typeof result.code === 'string' ? result.code : result.message
      const error = { code }
      if (code !== result.message) error.message = result.message
      return { error }
    }
    return { reply: result ?? null }
  }
}

function answer (response, status, value) {
  const body = JSON.stringify(value)
  response.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) })
  response.end(body)
}

async function body (request) {
  const chunks = []
  for await (const chunk of request) chunks.push(chunk)
  const text = Buffer.concat(chunks).toString()
  return text ? JSON.parse(text) : {}
}

export function handler (component, name = process.env.TOA_COMPONENT) {
  return async (request, response) => {
    const [kind, operation] = request.url.split('/').filter(Boolean)
    if (request.method === 'GET') {
      if (request.url === '/program') return answer(response, 200, component.description())
      return answer(response, 404, { error: { code: 'NOT_FOUND', message: request.url } })
    }
    try {
      const { input } = await body(request)
      if (kind === 'lifecycle' && COMMANDS.includes(operation)) {
        await component.lifecycle(operation)
        return answer(response, 200, {})
      }
      if (kind === 'operations' && component.operations.has(operation)) {
        return answer(response, 200, await component.operate(operation, input ?? null))
      }
      return answer(response, 404, { error: { code: 'NOT_FOUND', message: request.url } })
    } catch (error) {
      console.error(`${name}: ${kind} ${operation} failed:`, error)
      return answer(response, 500, { message: String(error?.stack ?? error) })
    }
  }
}

/** Loads the component in the current directory and serves it; exits 1 naming what is wrong. */
export async function main (env = process.env) {
  const name = env.TOA_COMPONENT ?? process.cwd()
  let modules
  try {
    modules = await load(process.cwd())
  } catch (error) {
    console.error(`${name}: ${error instanceof Refused ? error.message : error?.stack ?? error}`)
    process.exit(1)
  }
  const context = new Context(env)
  const component = new Component(modules, context)
  const server = http.createServer({ noDelay: true, keepAliveTimeout: 60_000 }, handler(component, name))
  context.atom.assignments.follow()
  server.listen(Number(env.TOA_PORT), '127.0.0.1')
  const stop = () => {
    context.atom.assignments.stop()
    server.close()
    server.closeAllConnections()
  }
  process.once('SIGTERM', stop)
  process.once('SIGINT', stop)
  return server
}
