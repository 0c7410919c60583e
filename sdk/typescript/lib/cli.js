// `toa`: the seeds' commands for npm users (`npx toa compose`, `npx toa call`, `npm run restart`,
// `npm stop`), forwarded to toa-agent. An application started in the background keeps its
// process id, its local API's address and its log in the project's `.toa/` directory.

import { spawn } from 'node:child_process'
import { accessSync, closeSync, constants, existsSync, mkdirSync, openSync, readFileSync, readdirSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { delimiter, dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { init } from './init.js'

export const USAGE = `toa: the seeds' commands, run by toa-agent

  toa compose DIR...             run components here, in the foreground (Ctrl-C drains them)
  toa call C.OPERATION [REQUEST] call an operation: toa call store.catalog.appraise "{ input: {...} }"
                                 (--task sends a task; --agent URL, else the app \`restart\` started)
  toa restart [DIR...]           (re)start the application in the background (default: ./components/*);
                                 returns once "Composition complete" is logged
  toa stop                       drain the application \`restart\` started: dispose runs, then it exits
  toa logs                       print its log (.toa/app.log)
  toa init                       a new project here: scripts, tsconfig.json, context.toa.yaml and
                                 one component (docs/first-project.md); overwrites nothing

The agent: $TOA_AGENT_BIN, else toa-agent on PATH, else a build in the toa repository this
package sits in (cargo build -p toa-agent).`

/** Where `restart` keeps the running application: `.toa/` in the project (the current directory). */
export const STATE = '.toa'
const RECORD = join(STATE, 'app.json')
const LOG = join(STATE, 'app.log')

/** How long `restart` waits for "Composition complete", and `stop` for the exit before a kill. */
const START_WITHIN = Number(process.env.TOA_START_TIMEOUT ?? 120) * 1000
const STOP_WITHIN = Number(process.env.TOA_STOP_TIMEOUT ?? 60) * 1000

const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), '..')

/** No toa-agent to run: the exit code says "command not found". */
class NoAgent extends Error {}

/** @param {string} path */
const executable = (path) => {
  try {
    accessSync(path, constants.X_OK)
    return statSync(path).isFile()
  } catch {
    return false
  }
}

/** The toa repository holding `from` (a `Cargo.toml` beside `agent/`), if any. @param {string} from */
function repositoryOf (from) {
  for (let dir = resolve(from); ; dir = dirname(dir)) {
    if (existsSync(join(dir, 'Cargo.toml')) && existsSync(join(dir, 'agent', 'Cargo.toml'))) return dir
    if (dirname(dir) === dir) return undefined
  }
}

/**
 * The toa-agent binary: $TOA_AGENT_BIN; toa-agent on PATH; the newest build of the toa repository
 * this package (or the project) sits in. Throws a message naming how to get one.
 * @param {NodeJS.ProcessEnv} env
 * @param {string} cwd
 */
export function locateAgent (env = process.env, cwd = process.cwd()) {
  if (env.TOA_AGENT_BIN) {
    if (executable(env.TOA_AGENT_BIN)) return env.TOA_AGENT_BIN
    throw new NoAgent(`$TOA_AGENT_BIN is ${env.TOA_AGENT_BIN}, which is not an executable file`)
  }
  for (const dir of (env.PATH ?? '').split(delimiter).filter(Boolean)) {
    if (executable(join(dir, 'toa-agent'))) return join(dir, 'toa-agent')
  }
  const root = repositoryOf(PACKAGE) ?? repositoryOf(cwd)
  if (root) {
    const target = resolve(root, env.CARGO_TARGET_DIR ?? 'target') // where cargo builds, as cargo reads it
    const built = ['release', 'debug'].map((profile) => join(target, profile, 'toa-agent'))
      .filter(executable)
      .sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs)
    if (built.length) return built[0]
    throw new NoAgent(`no toa-agent: not $TOA_AGENT_BIN, not on PATH, not built in ${root}; build it there with \`cargo build -p toa-agent\``)
  }
  throw new NoAgent('no toa-agent: not $TOA_AGENT_BIN and not on PATH; install it with `cargo install --path agent` from the toa repository, or set $TOA_AGENT_BIN')
}

/** What `restart` keeps: the agent's pid and the binary it runs (to know it again), its local
 * API's address once it serves, its log. @typedef {{ pid: number, binary?: string, agent?: string, log: string, started: string }} Running */

/** Whether `pid` is the agent `binary` runs, alive: a pid file can outlive its process and a pid
 * be reused, and nothing but a pid above 1 is ever signalled (`kill(-1)` reaches every process).
 * @param {unknown} pid @param {string} [binary] @returns {pid is number} */
function alive (pid, binary) {
  if (!Number.isInteger(pid) || /** @type {number} */ (pid) <= 1) return false
  try {
    process.kill(/** @type {number} */ (pid), 0)
  } catch {
    return false
  }
  let cmdline
  try {
    cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8')
  } catch {
    // With /proc, no entry is no process; without (macOS) the signal's answer is all there is.
    return !existsSync('/proc/self')
  }
  const program = cmdline.split('\0')[0] // empty for a zombie
  return binary === undefined ? program.endsWith('toa-agent') : program === binary
}

/** The application `restart` started here, if it still runs. @returns {Running | undefined} */
export function running () {
  if (!existsSync(RECORD)) return undefined
  try {
    const record = /** @type {Running} */ (JSON.parse(readFileSync(RECORD, 'utf8')))
    return alive(record.pid, record.binary) ? record : undefined
  } catch {
    return undefined
  }
}

const sleep = (/** @type {number} */ ms) => new Promise((resolve) => setTimeout(resolve, ms))

/** Runs the agent in the foreground with `args`, signals passed on; resolves to its exit code. @param {string[]} args */
function forward (args) {
  const child = spawn(locateAgent(), args, { stdio: 'inherit' })
  // Ctrl-C reaches the agent too (one process group): this process waits for it to drain.
  const pass = (/** @type {NodeJS.Signals} */ signal) => () => { child.kill(signal) }
  process.on('SIGINT', () => {})
  process.on('SIGTERM', pass('SIGTERM'))
  return new Promise((resolve) => {
    child.on('exit', (code, signal) => resolve(code ?? (signal ? 128 : 1)))
  })
}

/** `toa call`: to the application `restart` started, unless --agent or $TOA_AGENT says where. @param {string[]} args */
function call (args) {
  const told = args.some((a) => a === '--agent' || a.startsWith('--agent=')) || process.env.TOA_AGENT
  const app = told ? undefined : running()
  return forward(['call', ...args, ...(app?.agent ? ['--agent', app.agent] : [])])
}

/** The default components: every directory of ./components holding a manifest. */
function componentDirectories () {
  if (!existsSync('components')) throw new Error('no components/ here (run it in the project\'s directory), or name the components\' directories, as `toa restart ./components/*`')
  return readdirSync('components').sort()
    .map((name) => join('components', name))
    .filter((dir) => existsSync(join(dir, 'manifest.toa.yaml')))
}

/** Waits for `pid` to exit, at most `within` ms; whether it did. @param {number} pid @param {number} within @param {string} [binary] */
async function exited (pid, within, binary) {
  const deadline = Date.now() + within
  while (Date.now() < deadline) {
    if (!alive(pid, binary)) return true
    await sleep(100)
  }
  return !alive(pid, binary)
}

/** Signals `pid` (its whole process group: the agent leads one, with its programs); a process
 * that is already gone is no error. @param {number} pid @param {NodeJS.Signals} name @param {boolean} [group] */
function signal (pid, name, group = false) {
  try {
    process.kill(group ? -pid : pid, name)
  } catch {}
}

/** `toa stop`: SIGTERM drains the application (dispose runs); a kill only after STOP_WITHIN. */
async function stop () {
  const app = running()
  if (!app) {
    console.log('toa: no application started by `toa restart` runs here')
    rmSync(RECORD, { force: true })
    return 0
  }
  signal(app.pid, 'SIGTERM')
  if (!(await exited(app.pid, STOP_WITHIN, app.binary))) {
    console.error(`toa: the application (pid ${app.pid}) did not exit within ${STOP_WITHIN / 1000} s of SIGTERM; killed with its programs (its log: ${app.log})`)
    signal(app.pid, 'SIGKILL', true)
    await exited(app.pid, 5000, app.binary)
    rmSync(RECORD, { force: true })
    return 1
  }
  rmSync(RECORD, { force: true })
  console.log(`toa: stopped (pid ${app.pid}); its log: ${app.log}`)
  return 0
}

/** The local API's address the agent logged, once "Composition complete" is logged. @param {string} log */
function completed (log) {
  if (!log.includes('Composition complete')) return undefined
  return /serving the local API agent=(\S+)/.exec(log)?.[1] ?? ''
}

/** The agent's environment: the two lines `restart` waits for are logged at info, whatever
 * level `RUST_LOG` asks for otherwise. */
function environment () {
  const level = process.env.RUST_LOG
  return { ...process.env, RUST_LOG: level ? `${level},toa_agent::process::compose=info` : 'info' }
}

/** `toa restart`: stops the running application, starts it in the background, waits for it.
 * What it needs (the agent, the components) is found before anything is stopped. @param {string[]} args */
async function restart (args) {
  const agent = locateAgent()
  const components = args.length ? args : componentDirectories()
  if (running() && (await stop()) !== 0) return 1
  mkdirSync(STATE, { recursive: true })
  if (existsSync(LOG)) renameSync(LOG, `${LOG}.1`) // the previous run's log, kept once
  const out = openSync(LOG, 'a')
  let child
  try {
    child = spawn(agent, ['compose', ...components], { detached: true, stdio: ['ignore', out, out], env: environment() })
  } finally {
    closeSync(out)
  }
  child.unref()
  const pid = /** @type {number} */ (child.pid)
  /** @type {Running} */
  const record = { pid, binary: agent, log: LOG, started: new Date().toISOString() }
  // Kept at once: a restart interrupted now still leaves the agent findable by `stop`.
  writeFileSync(RECORD, JSON.stringify(record) + '\n')
  const deadline = Date.now() + START_WITHIN
  for (;;) {
    const address = completed(readFileSync(LOG, 'utf8'))
    if (address !== undefined) {
      writeFileSync(RECORD, JSON.stringify({ ...record, agent: address || undefined }) + '\n')
      console.log(`toa: Composition complete (pid ${pid}, local API ${address}); its log: ${LOG}`)
      return 0
    }
    if (!alive(pid, agent) || Date.now() > deadline) {
      const why = alive(pid, agent) ? `not complete within ${START_WITHIN / 1000} s` : 'exited before it was complete'
      signal(pid, 'SIGTERM')
      await exited(pid, STOP_WITHIN, agent)
      rmSync(RECORD, { force: true })
      console.error(`toa: the application ${why}; the end of its log (${LOG}):\n${readFileSync(LOG, 'utf8').split('\n').slice(-20).join('\n')}`)
      return 1
    }
    await sleep(100)
  }
}

/** `toa logs`: the application's log, as `restart` wrote it. */
function logs () {
  if (!existsSync(LOG)) {
    console.error(`toa: no log here (${LOG}): start the application with \`toa restart\``)
    return 1
  }
  process.stdout.write(readFileSync(LOG))
  return 0
}

/** Runs `toa ARGS...`; resolves to the exit code. @param {string[]} argv */
export async function main (argv) {
  const [command, ...args] = argv
  try {
    switch (command) {
      case 'compose': return await forward(['compose', ...args])
      case 'call': return await call(args)
      case 'restart': return await restart(args)
      case 'stop': return await stop()
      case 'logs': return logs()
      case 'init':
        for (const path of init('.')) console.log(`toa: wrote ${path}`)
        console.log('toa: next: npm run types && npm run check && npm run restart')
        return 0
      case undefined: case '--help': case '-h': case 'help':
        console.log(USAGE)
        return command === undefined ? 2 : 0
      default:
        console.error(`toa: unknown command ${JSON.stringify(command)}\n\n${USAGE}`)
        return 2
    }
  } catch (error) {
    console.error(`toa: ${/** @type {Error} */ (error).message}`)
    return error instanceof NoAgent ? 127 : 1
  }
}
