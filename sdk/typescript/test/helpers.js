// What the tests share: the agent binary, private Redis servers, waiting for a condition.

import { spawn, spawnSync } from 'node:child_process'
import { mkdtempSync, writeFileSync } from 'node:fs'
import { createConnection } from 'node:net'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { freePort } from '../lib/stage.js'

export { freePort }

export const HERE = dirname(fileURLToPath(import.meta.url))
export const ROOT = resolve(HERE, '..', '..', '..')
export const EXAMPLES = join(ROOT, 'examples', 'typescript')
export const COMPONENTS = join(EXAMPLES, 'components')
export const FIXTURES = join(HERE, 'components')

/** $TOA_AGENT_BIN, else the workspace's debug build ($CARGO_TARGET_DIR or target). */
export const AGENT = process.env.TOA_AGENT_BIN ??
  join(process.env.CARGO_TARGET_DIR ?? join(ROOT, 'target'), 'debug', 'toa-agent')

// Each test's application alone, whatever runs beside it (a local run otherwise joins the other
// processes of its application on this machine); the tests of that group say TOA_ALONE=false.
process.env.TOA_ALONE ??= 'true'

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

export function scratch (prefix = 'toa-ts-') {
  return mkdtempSync(join(tmpdir(), prefix))
}

/** Waits until `condition()` is truthy (it may be async), at most `within` ms; its value. */
export async function until (condition, within, what) {
  const deadline = Date.now() + within
  let last
  while (Date.now() < deadline) {
    last = await condition()
    if (last) return last
    await sleep(50)
  }
  throw new Error(`not within ${within} ms: ${what} (last: ${JSON.stringify(last)})`)
}

const answers = (port) => new Promise((resolve) => {
  const socket = createConnection({ host: '127.0.0.1', port }, () => { socket.destroy(); resolve(true) })
  socket.on('error', () => resolve(false))
})

/** An OTLP/HTTP trace receiver of the test's own (agent/tests/otlp_receiver.py, which decodes
 * with the OpenTelemetry project's messages): its `endpoint`, and the `spans` it took so far. */
export async function otlpReceiver () {
  const port = await freePort()
  const child = spawn('python3', [join(ROOT, 'agent', 'tests', 'otlp_receiver.py'), String(port)], { stdio: ['ignore', 'pipe', 'inherit'] })
  /** @type {any[]} */
  const spans = []
  let rest = ''
  let listening = false
  child.stdout.on('data', (chunk) => {
    const lines = (rest + chunk).split('\n')
    rest = lines.pop() ?? ''
    for (const line of lines) {
      if (line === 'listening') listening = true
      else if (line) spans.push(JSON.parse(line))
    }
  })
  await until(() => listening, 10_000, `the OTLP receiver on ${port}`)
  return { endpoint: `http://127.0.0.1:${port}`, spans: () => [...spans], stop: () => child.kill('SIGKILL') }
}

/** A redis-server of the test's own on a free port, nothing kept on disk. */
export async function redis () {
  const port = await freePort()
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' })
  await until(() => answers(port), 10_000, `redis-server on ${port}`)
  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    stop: () => child.kill('SIGSTOP'),
    kill: () => { child.kill('SIGCONT'); child.kill('SIGKILL') }
  }
}

/** A context.toa.yaml with `body` (YAML), in a directory of its own; its path. */
export function contextFile (body) {
  const path = join(scratch('toa-ts-context-'), 'context.toa.yaml')
  writeFileSync(path, body)
  return path
}

export function tsc (directory) {
  return spawnSync(join(EXAMPLES, 'node_modules', '.bin', 'tsc'), ['--noEmit', '-p', directory], { encoding: 'utf8' })
}
