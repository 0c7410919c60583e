// The seeds' commands as a reader types them: `npm run restart`, `npx toa call`, `npm stop`, in
// examples/typescript, one shell per seed's "Try it", its lines as the seed writes them.

import assert from 'node:assert/strict'
import { spawn, spawnSync } from 'node:child_process'
import { chmodSync, existsSync, mkdirSync, readFileSync, utimesSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { join } from 'node:path'
import { describe, test } from 'node:test'
import { locateAgent } from '../lib/cli.js'
import { AGENT, EXAMPLES, HERE, ROOT, scratch } from './helpers.js'

/** Runs `script` in bash in examples/typescript, with the tests' agent; its output and status. */
function shell (script, env = {}) {
  const run = spawnSync('bash', ['-c', script], {
    cwd: EXAMPLES,
    env: { ...process.env, TOA_AGENT_BIN: AGENT, ...env },
    encoding: 'utf8',
    timeout: 240_000
  })
  return { out: run.stdout, err: run.stderr, status: run.status }
}

/** The application `npm run restart` started, stopped whatever a failed test left. */
const leftover = () => shell('npx toa stop >/dev/null')

const running = () => existsSync(join(EXAMPLES, '.toa', 'app.json'))

/** The bin, run with node (outside a project that installed the package). */
const BIN = join(HERE, '..', 'bin', 'toa.js')

/** The local API's default port (toa_context::control::LOCAL_PORT). */
const LOCAL_PORT = 7090

describe('toa, the seeds\' commands', () => {
  test('--help lists the commands the seeds use', () => {
    const { out, status } = shell('npx toa --help')
    assert.equal(status, 0)
    for (const command of ['compose', 'call', 'restart', 'stop', 'logs']) {
      assert.match(out, new RegExp(`toa ${command}\\b`), command)
    }
  })

  test("seed 000's Try it: the eleventh appraisal within a minute is TOO_MANY_REQUESTS", async () => {
    const call = "npx toa call store.catalog.appraise \"{ input: { customer: 'c1', product: 'a1' } }\""
    try {
      const started = shell('npm run restart')
      const api = started.out.match(/Composition complete \(pid \d+, local API (http:\/\/127\.0\.0\.1:\d+)\); its log: \.toa\/app\.log/)
      assert.ok(api, `${started.out}\n${started.err}`)
      // The meter's debt is paid off as time passes (one call's 6 s of cost in 6 s), so the
      // eleventh is refused only while the eleven come within 6 s; each `npx toa call` starts
      // Node, which took 1.4 s a call in a loaded CI run (the eleventh then passed). The first
      // ten go to the local API the command calls, the eleventh as the seed writes it.
      for (let n = 1; n <= 10; n++) {
        const response = await fetch(`${api[1]}/v1/call/store.catalog/appraise`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ input: { customer: 'c1', product: 'a1' } })
        })
        assert.deepEqual(await response.json(), { reply: { product: 'a1', price: 42 } }, `appraisal ${n}`)
      }
      const { out, err } = shell(`${call}\nnpm stop`)
      assert.match(out, /TOO_MANY_REQUESTS/, `${out}\n${err}`)
      assert.match(out, /stopped \(pid \d+\)/)
      assert.ok(!running(), 'npm stop removed what restart kept')
    } finally {
      leftover()
    }
  })

  test("seed 000's Try it, the second terminal: the slots divide between the two", () => {
    const dir = scratch()
    const [second, group] = [join(dir, 'second.log'), join(dir, 'second.pgid')]
    const env = { TOA_ALONE: 'false', TOA_RUNTIME_DIR: dir }
    // The first terminal's application, then the second terminal's line as the seed writes it:
    // a job of its own process group, as a terminal's is (its Ctrl-C reaches npx, toa and the
    // agent together); its log aside.
    const started = shell([
      'npm run restart',
      `setsid npx toa compose ./components/* > "${second}" 2>&1 &`,
      `echo $! > "${group}"`,
      `for i in $(seq 600); do grep -q "Composition complete" "${second}" && break; sleep 0.1; done`
    ].join('\n'), env)
    try {
      const log = readFileSync(second, 'utf8')
      assert.match(log, /local group: joined the application's first process/, `${log}\n${started.err}`)
      // `share` answers the slots of the replica that took the call; the group hands calls to
      // either process in turn. Asked until both halves were seen (at most 40 times).
      const halves = new Set()
      for (let asked = 0; asked < 40 && halves.size < 2; asked++) {
        const { out } = shell('npx toa call notifications.share', env)
        const share = JSON.parse(out).reply
        if (Array.isArray(share) && share.length === 8) halves.add(JSON.stringify(share))
        spawnSync('sleep', ['0.25'])
      }
      const split = [...halves].map((half) => JSON.parse(half))
      assert.equal(split.length, 2, `two halves of 16: ${[...halves].join(' ')}`)
      assert.deepEqual([...split[0], ...split[1]].sort((a, b) => a - b), Array.from({ length: 16 }, (_, i) => i))
    } finally {
      // Its Ctrl-C, as SIGTERM (a script's background job ignores SIGINT; both drain); then npm stop.
      const stopped = shell([
        `kill -TERM -- -$(cat "${group}")`,
        `for i in $(seq 300); do grep -q "stopped" "${second}" && break; sleep 0.1; done`,
        'npm stop'
      ].join('\n'), env)
      assert.match(readFileSync(second, 'utf8'), /INFO .*stopped/, `the second drained\n${stopped.err}`)
      leftover()
    }
  })

  test("seed 001's Try it: the connection opens before Composition complete; npm stop runs dispose and exits", () => {
    const record = join(scratch(), 'mailer')
    const script = [
      'npm run restart',
      'cp "$MAILER_RECORD" "$MAILER_RECORD.at-start"',
      "npx toa call notifications.send \"{ input: { to: 'ann@example.com', text: 'Hello' } }\"",
      'npx toa logs | grep -c "Composition complete"',
      'npm stop'
    ].join('\n')
    try {
      const { out, err } = shell(script, { MAILER_RECORD: record })
      assert.equal(readFileSync(`${record}.at-start`, 'utf8'), 'connected smtp://localhost:2525 50\n', 'opened once, before restart returned')
      assert.match(out, /^1$/m, 'the log of app says Composition complete')
      assert.deepEqual(readFileSync(record, 'utf8').split('\n').filter(Boolean),
        ['connected smtp://localhost:2525 50', 'sent ann@example.com', 'closed'], `dispose ran on npm stop\n${out}\n${err}`)
      assert.ok(!running())
    } finally {
      leftover()
    }
  })

  test("seed 003's Try it: one unit, two reservations at once, one OUT_OF_STOCK", () => {
    const id = "query: { id: 'c0ffee00c0ffee00c0ffee00c0ffee00' }"
    const script = [
      'npm run restart',
      `npx toa call fulfilment.stock.transit "{ ${id}, input: { available: 1 } }"`,
      `npx toa call fulfilment.stock.reserve "{ ${id}, input: { quantity: 1 } }" &`,
      `npx toa call fulfilment.stock.reserve "{ ${id}, input: { quantity: 1 } }" &`,
      'wait',
      'npm stop'
    ].join('\n')
    try {
      const { out } = shell(script)
      assert.equal(out.match(/"available": 0/g)?.length, 1, out)
      assert.equal(out.match(/OUT_OF_STOCK/g)?.length, 1, out)
    } finally {
      leftover()
    }
  })

  test("seed 003's Try it with --environment dev: the stock is kept in PostgreSQL, past a restart", () => {
    // The database outlives the test: an id of this run's own.
    const id = `query: { id: 'dev${process.pid}${Date.now()}' }`
    const script = [
      'npm run restart -- --environment dev',
      `npx toa call fulfilment.stock.transit "{ ${id}, input: { available: 1 } }"`,
      `npx toa call fulfilment.stock.reserve "{ ${id}, input: { quantity: 1 } }" &`,
      `npx toa call fulfilment.stock.reserve "{ ${id}, input: { quantity: 1 } }" &`,
      'wait',
      'npm run restart -- --environment dev',
      'echo AFTER THE RESTART',
      `npx toa call fulfilment.stock.observe "{ ${id} }"`,
      'npm stop'
    ].join('\n')
    try {
      const { out } = shell(script, { TOA_STORAGE_USERNAME: 'toa', TOA_STORAGE_PASSWORD: 'toa' })
      const [before, after = ''] = out.split('AFTER THE RESTART')
      assert.equal(before.match(/"available": 0/g)?.length, 1, out)
      assert.equal(before.match(/OUT_OF_STOCK/g)?.length, 1, out)
      // The embedded store would have started empty: the item at its blank, version 0.
      assert.match(after, /"available": 0/, out)
      assert.match(after, /"VERSION": 2/, out)
    } finally {
      leftover()
    }
  })

  test('a restart of a running application stops it first, keeps the previous log once, and call finds it on whatever port it serves', async () => {
    // A second terminal's application (or anything) on the local API's port: compose serves on
    // another, and restart records which.
    const blocker = createServer()
    await new Promise((resolve) => blocker.once('error', resolve).listen(LOCAL_PORT, '127.0.0.1', resolve))
    try {
      const { out } = shell('npm run -s restart && npx toa call store.catalog.price "{ input: { product: a1 } }" && npm run -s restart && npm run -s stop')
      assert.doesNotMatch(out, new RegExp(`local API http://127\\.0\\.0\\.1:${LOCAL_PORT}\\)`), 'the taken port was not served')
      assert.match(out, /"reply"/, `npx toa call reached the application restart started\n${out}`)
      const pids = [...out.matchAll(/Composition complete \(pid (\d+)/g)].map((m) => m[1])
      assert.equal(pids.length, 2, out)
      assert.notEqual(pids[0], pids[1])
      assert.match(out, new RegExp(`stopped \\(pid ${pids[0]}\\)[^]*stopped \\(pid ${pids[1]}\\)`), out)
      assert.match(readFileSync(join(EXAMPLES, '.toa', 'app.log.1'), 'utf8'), /Composition complete/)
    } finally {
      leftover()
      blocker.close()
    }
  })

  test('stop with nothing running says so and succeeds; call with nothing running names the agent it tried', () => {
    const stop = shell('npx toa stop')
    assert.equal(stop.status, 0)
    assert.match(stop.out, /no application started by `toa restart` runs here/)
    const call = shell('npx toa call store.catalog.price "{ input: { product: a1 } }" --agent http://127.0.0.1:9')
    assert.equal(call.status, 1)
    assert.match(call.err, /no agent answers at http:\/\/127\.0\.0\.1:9/)
  })
})

describe('what toa restart and stop will not do', () => {
  test('stop signals no process its record does not name as the agent it started (a stale or copied .toa/app.json)', () => {
    const dir = scratch('toa-stale-')
    const other = spawn('sleep', ['30'], { stdio: 'ignore' })
    try {
      for (const pid of [other.pid, 1, 0, -1]) {
        mkdirSync(join(dir, '.toa'), { recursive: true })
        writeFileSync(join(dir, '.toa', 'app.json'), JSON.stringify({ pid, binary: '/nowhere/toa-agent', log: '.toa/app.log' }))
        const stop = spawnSync(process.execPath, [BIN, 'stop'], { cwd: dir, encoding: 'utf8' })
        assert.equal(stop.status, 0, stop.stderr)
        assert.match(stop.stdout, /no application started by `toa restart` runs here/, `pid ${pid}`)
        assert.ok(!existsSync(join(dir, '.toa', 'app.json')), 'the stale record is gone')
      }
      assert.equal(other.exitCode, null, 'the other process was not signalled')
      assert.equal(other.signalCode, null)
    } finally {
      other.kill()
    }
  })

  test('restart without components/ says so before it stops or writes anything', () => {
    const dir = scratch('toa-empty-')
    const restart = spawnSync(process.execPath, [BIN, 'restart'], { cwd: dir, encoding: 'utf8', env: { ...process.env, TOA_AGENT_BIN: AGENT } })
    assert.equal(restart.status, 1)
    assert.match(restart.stderr, /no components\/ here \(run it in the project's directory\)/)
    assert.ok(!existsSync(join(dir, '.toa')), 'nothing written')
  })
})

describe('where toa finds toa-agent', () => {
  const fake = (dir) => {
    mkdirSync(dir, { recursive: true })
    writeFileSync(join(dir, 'toa-agent'), '#!/bin/sh\n')
    chmodSync(join(dir, 'toa-agent'), 0o755)
    return join(dir, 'toa-agent')
  }

  test('$TOA_AGENT_BIN first, then PATH, then the newest build of this repository', () => {
    const dir = scratch()
    const given = fake(join(dir, 'given'))
    const onPath = fake(join(dir, 'bin'))
    assert.equal(locateAgent({ TOA_AGENT_BIN: given, PATH: join(dir, 'bin') }), given)
    assert.equal(locateAgent({ PATH: `/nonexistent:${join(dir, 'bin')}` }), onPath)
    const target = join(dir, 'target')
    const debug = fake(join(target, 'debug'))
    utimesSync(debug, new Date(Date.now() - 60_000), new Date(Date.now() - 60_000))
    assert.equal(locateAgent({ PATH: '', CARGO_TARGET_DIR: target }), debug, 'the package sits in this repository')
    const release = fake(join(target, 'release'))
    assert.equal(locateAgent({ PATH: '', CARGO_TARGET_DIR: target }), release, 'the newer build')
  })

  test('a $TOA_AGENT_BIN that is not a program is named; none anywhere says how to build one', () => {
    const dir = scratch()
    writeFileSync(join(dir, 'toa-agent'), 'not a program')
    assert.throws(() => locateAgent({ TOA_AGENT_BIN: join(dir, 'toa-agent') }),
      new RegExp(`\\$TOA_AGENT_BIN is ${join(dir, 'toa-agent')}, which is not an executable file`))
    assert.throws(() => locateAgent({ PATH: '', CARGO_TARGET_DIR: join(dir, 'empty') }),
      new RegExp(`not built in ${ROOT}; build it there with \`cargo build -p toa-agent\``))
  })
})
