// The runtime under the real agent: what it refuses, and the context's calls.

import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { mkdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { Component } from '../lib/runtime.js'
import { compose } from '../lib/stage.js'
import { AGENT, FIXTURES, HERE, contextFile, freePort, otlpReceiver, redis, scratch, until } from './helpers.js'

/** What the agent said when `component` did not start. */
const refusal = async (component) => {
  const started = await compose([`${FIXTURES}/${component}`], { agent: AGENT }).then(
    async (stage) => { await stage.stop(); return null },
    (error) => error)
  assert.ok(started, `${component} started`)
  return started.message
}

describe('a component that must not start', () => {
  test('declares an operation no module serves', async () => {
    assert.match(await refusal('shop.ghost'), /ghost/)
  })

  test('exports pause and no resume', async () => {
    assert.match(await refusal('shop.paused'), /`pause` and no `resume`/)
  })

  test('lists a run command no rc/ module exports', async () => {
    assert.match(await refusal('shop.listed'), /dispose/)
  })

  test('has an event module without condition, or a receiver module without request', async () => {
    const dir = scratch()
    const component = (name, files) => {
      mkdirSync(join(dir, name, 'operations'), { recursive: true })
      for (const [path, text] of Object.entries(files)) {
        mkdirSync(join(dir, name, path, '..'), { recursive: true })
        writeFileSync(join(dir, name, path), text)
      }
      return join(dir, name)
    }
    const manifest = `name: n\nprogram: [node, ${join(HERE, '..', 'bin', 'toa-node.js')}]\nentity: { properties: { n: { type: integer } } }\nevents: { changed: {} }\noperations: { assign: { input: { type: object, properties: { n: { type: integer } } } } }\nreceivers: { shop.orders.approved: assign }\n`
    const refused = async (directory) => (await compose([directory], { agent: AGENT }).then(
      async (stage) => { await stage.stop(); return null }, (error) => error))?.message
    assert.match(await refused(component('conditionless', { 'manifest.toa.yaml': manifest, 'events/changed.ts': 'export const when = () => true\n' })),
      /events\/changed.ts: expected a function named condition\(entry, previous\)/)
    assert.match(await refused(component('requestless', { 'manifest.toa.yaml': manifest, 'receivers/shop.orders.approved.ts': 'export const make = () => ({})\n' })),
      /receivers\/shop.orders.approved.ts: expected a function named request\(payload\)/)
    assert.match(await refused(component('unconditioned', { 'manifest.toa.yaml': manifest, 'events/gone.ts': 'export const condition = () => true\n' })),
      /condition module for the event "gone"/)
  })
})

describe('conditions and adaptations', () => {
  const component = new Component({
    operations: new Map(),
    commands: new Map(),
    receivers: new Map([['shop.orders.approved', (payload) => ({ input: { to: payload.customer } })]]),
    conditions: new Map([
      ['big', (entry) => entry.n >= 10],
      ['crossed', (entry, previous) => entry.n >= 10 && (previous === null || previous.n < 10)],
      ['forgot', (entry) => entry.n === 99 ? undefined : false]
    ])
  }, /** @type {any} */ (null))

  test('the events whose condition holds, from the object and what it was', async () => {
    assert.deepEqual(await component.publish({ n: 12 }, { n: 3 }), { publish: ['big', 'crossed'] })
    assert.deepEqual(await component.publish({ n: 12 }, { n: 11 }), { publish: ['big'] })
    assert.deepEqual(await component.publish({ n: 12 }, undefined), { publish: ['big', 'crossed'] })
    assert.deepEqual(await component.publish({ n: 1 }, null), { publish: [] })
    await assert.rejects(component.publish({ n: 99 }, null), /events\/forgot: condition returned undefined, expected true or false/)
  })

  test('the description lists them, and an adaptation makes the request', async () => {
    assert.deepEqual(component.description().conditions, ['big', 'crossed', 'forgot'])
    assert.deepEqual(component.description().receivers, ['shop.orders.approved'])
    assert.deepEqual(await component.adapt('shop.orders.approved', { customer: 'c1' }), { request: { input: { to: 'c1' } } })
  })
})

describe('the context', () => {
  let stage
  before(async () => { stage = await compose([`${FIXTURES}/shop.probe`], { agent: AGENT }) })
  after(async () => { await stage?.stop() })

  test('calls end as the seeds say, told apart by code', async () => {
    const outcomes = await stage.call('shop.probe.calls')
    assert.deepEqual(outcomes.local, { reply: { hello: 1 } }, 'context.local reaches the stateful echo by instance')
    assert.deepEqual(outcomes.nobody, { code: 'UNKNOWN_COMPONENT', name: 'UNKNOWN_COMPONENT' })
    assert.deepEqual(outcomes.refused, { error: 'NOPE' }, "the operation's own error comes back as an Error")
    assert.deepEqual(outcomes.abortedBefore, { code: 404, name: 'Abandoned' }, 'an aborted signal: the call is made nowhere')
    assert.deepEqual(outcomes.abortedDuring, { code: 404, name: 'Abandoned' }, 'the signal ends the wait')
    assert.deepEqual(outcomes.timedOut, { code: 404, name: 'Abandoned' }, 'the timeout ends the wait')
    assert.deepEqual(outcomes.signalOnOrdinary, { code: 202, name: 'RequestContract' })
    assert.deepEqual(outcomes.noInstance, { code: 202, name: 'RequestContract' }, 'a stateful call without instance')
    assert.equal(outcomes.failed.name, 'FAILED', 'a thrown exception is a failure')
    assert.deepEqual(outcomes.unknownField, { code: 202, message: 'shop.probe.refuse: unknown request field `qeury` (known: input, instance, query, key)' })
    assert.deepEqual(outcomes.unknownOption, { code: 202, name: 'RequestContract' }, 'an option is checked too')
    assert.deepEqual(outcomes.task, { reply: null }, '{ discard: true } is a task: null once sent')
    assert.equal(outcomes.taskRan, true, 'and the task ran')
    assert.deepEqual(outcomes.signalOnTask, { code: 202, name: 'RequestContract' }, 'nothing waits on a task')
    await until(() => /broken on purpose/.test(stage.output()), 5000, 'the failure logged with its stack')
  })

  test('context.call is the call the operation answers: its id, redelivered, its deadline', async () => {
    const before = Date.now()
    const call = await stage.call('shop.probe.whoami')
    assert.match(call.id, /\S/)
    assert.equal(call.redelivered, false)
    assert.ok(call.deadline_ms > before, `a deadline after the call was made: ${JSON.stringify(call)}`)
    assert.notEqual((await stage.call('shop.probe.whoami')).id, call.id, 'each call its own id')
  })

  test('an error code the manifest does not declare is the program\'s failure, logged with the code', async () => {
    await assert.rejects(stage.call('shop.probe.stray'), (error) =>
      error.name === 'FAILED' && /answered the error STRAY, which its manifest does not declare \(errors: \[\]\)/.test(error.message))
    // The log reaches the stage on its own pipe, maybe after the answer.
    await until(() => /WARN.*does not declare.*code=STRAY/.test(stage.output()), 5000, 'the code logged')
    // A code of the runtime's own, passed on, needs no declaration.
    const passed = await stage.call('shop.probe.passon').then((reply) => reply, (error) => error)
    assert.equal(passed.code, 'CONFLICT', `${passed}`)
  })

  test("the operation's own error reaches a caller outside", async () => {
    const error = await stage.call('shop.probe.refuse')
    assert.ok(error instanceof Error)
    assert.equal(error.code, 'NOPE')
  })

  test('a lock released as usual does not abort its signal', async () => {
    assert.deepEqual(await stage.call('shop.probe.released'), { aborted: false })
  })

  test('onassigned tells the assignment at once, and slots follow it', async () => {
    const { first, slots } = await stage.call('shop.probe.assigned')
    assert.deepEqual({ i: first.i, n: first.n }, { i: 0, n: 1 }, 'alone, replica 0 of 1')
    assert.deepEqual(slots, [0, 1, 2, 3])
  })
})

test("an operation's calls join the trace its request came with: the nested call is a child of its run", async () => {
  const receiver = await otlpReceiver()
  const env = { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY: '50' }
  const stage = await compose([`${FIXTURES}/shop.probe`], { agent: AGENT, env })
  try {
    assert.deepEqual(await stage.call('shop.probe.relay'), { relayed: true })
    const names = ['call shop.probe.relay', 'operate shop.probe.relay', 'lock shop.probe', 'call shop.probe.echo', 'operate shop.probe.echo']
    const spans = await until(() => {
      const found = names.map((name) => receiver.spans().find((span) => span.name === name))
      return found.every(Boolean) && found
    }, 20_000, 'the spans of the relayed call')
    const [call, relay, lock, nested, echo] = spans
    assert.equal(relay.parent, call.span, JSON.stringify(spans))
    assert.equal(lock.parent, relay.span, 'the lock\'s wait too')
    assert.equal(nested.parent, relay.span, 'the program passed the trace it was given on')
    assert.equal(echo.parent, nested.span)
    assert.ok(spans.every((span) => span.trace === call.trace), 'one trace')
  } finally {
    await stage.stop()
    receiver.stop()
  }
})

test("seed 000: a lock's wait ends with its call; what it guards never runs after the caller was told it failed", async () => {
  // Ordinary calls of a second each; a holder keeps the lock for three.
  const context = contextFile('name: sdk\nlimits:\n  operation: 1000\n')
  const stage = await compose([`${FIXTURES}/shop.probe`], { agent: AGENT, context })
  try {
    const holding = stage.call('shop.probe.hold', { input: { ms: 3000 } }).catch((error) => error)
    await until(async () => (await stage.call('shop.probe.guardlog')).holding, 5000, 'the holder holds')
    await assert.rejects(stage.call('shop.probe.guarded'), (error) => error.name === 'FAILED', 'the caller: failed at the limit')
    const { guarded, holding: still } = await until(async () => {
      const log = await stage.call('shop.probe.guardlog')
      return log.guarded.length > 0 && log
    }, 5000, 'the guarded call ended')
    assert.deepEqual(guarded, ['DEADLINE'], 'the lock refused at the deadline, its work never ran')
    assert.equal(still, true, 'while the holder still held it')
    assert.equal((await holding).name, 'FAILED', 'the holder outlived its own limit')
  } finally {
    await stage.stop()
  }
})

test('the stash: what one replica keeps another sees, until its time to live; a bad ttl or value is refused', async () => {
  const server = await redis()
  const context = contextFile(`name: sdk\natomicity:\n  redis: ${server.url}\n  interval: 1000\n`)
  const [one, two] = [await compose([`${FIXTURES}/shop.probe`], { agent: AGENT, context }),
    await compose([`${FIXTURES}/shop.probe`], { agent: AGENT, context })]
  const stash = (stage, input) => stage.call('shop.probe.stashed', { input })
  try {
    assert.deepEqual(await stash(one, { op: 'set', key: 'rate/eur', value: { rate: 1.1 }, ttl: 60_000 }), { done: null })
    assert.deepEqual(await stash(two, { op: 'get', key: 'rate/eur' }), { done: { rate: 1.1 } }, 'the other replica sees it')
    assert.deepEqual(await stash(one, { op: 'set', key: 'flag', value: true, ttl: 300 }), { done: null })
    await until(async () => (await stash(two, { op: 'get', key: 'flag' })).done === null, 5000, 'gone after its ttl')
    assert.deepEqual(await stash(two, { op: 'delete', key: 'rate/eur' }), { done: true })
    assert.deepEqual(await stash(one, { op: 'get', key: 'rate/eur' }), { done: null })
    assert.deepEqual(await stash(one, { op: 'delete', key: 'rate/eur' }), { done: false }, 'nothing left to delete')
    const refused = await stash(one, { op: 'set', key: 'k', value: 1, ttl: 31 * 24 * 3600 * 1000 })
    assert.equal(refused.error?.code, 'BAD_REQUEST')
    assert.match(refused.error.message, /ttl: expected 1 to 2592000000 ms \(30 days\)/)
    const large = await stash(one, { op: 'set', key: 'k', size: 1024 * 1024, ttl: 1000 })
    assert.match(large.error?.message ?? '', /value: expected at most 1048576 bytes/)
    assert.match((await stash(one, { op: 'set', key: 'k', value: 1 })).error?.message ?? '', /ttl \(ms\) is required/)
    assert.deepEqual(await stash(two, { op: 'get', key: 'k' }), { done: null }, 'nothing refused was kept')
  } finally {
    await Promise.all([one.stop(), two.stop()])
    server.kill()
  }
})

test('a call from a transition that retries to an operation made once is refused with the seed\'s exception', async () => {
  const stage = await compose([`${FIXTURES}/shop.ledger`], { agent: AGENT })
  try {
    await stage.call('shop.ledger.transit', { query: { id: 'a' }, input: { balance: 50 } })
    const swept = await stage.call('shop.ledger.sweep', { query: { id: 'a' }, input: { to: 'b' } })
    assert.deepEqual(swept, {
      refused: "UnrepeatableException: 'shop.ledger.credit' is made once, and a transition retried on a lost write would make it again"
    })
    const left = await stage.call('shop.ledger.observe', { query: { id: 'a' } })
    assert.deepEqual({ balance: left.balance, VERSION: left.VERSION }, { balance: 50, VERSION: 1 }, 'nothing written')
    // Outside a transition the same call goes through.
    assert.deepEqual(await stage.call('shop.ledger.credit', { query: { id: 'b' }, input: { amount: 5 } }), { balance: 5 })
  } finally {
    await stage.stop()
  }
})

test('a component outside any "type": "module" package loads its TypeScript too', async () => {
  const dir = join(scratch(), 'plain.echo')
  mkdirSync(join(dir, 'operations'), { recursive: true })
  writeFileSync(join(dir, 'manifest.toa.yaml'), `name: echo\nnamespace: plain\nprogram: [node, ${join(HERE, '..', 'bin', 'toa-node.js')}]\noperations:\n  echo: { type: computation }\n`)
  writeFileSync(join(dir, 'operations', 'echo.ts'), 'export function computation (input: unknown): unknown { return input }\n')
  const stage = await compose([dir], { agent: AGENT })
  try {
    assert.deepEqual(await stage.call('plain.echo.echo', { input: { a: 1 } }), { a: 1 })
  } finally {
    await stage.stop()
  }
})

test('the program outlives Ctrl-C (the agent stops it with SIGTERM, after dispose)', async () => {
  const port = await freePort()
  const program = spawn('node', [join(HERE, '..', 'bin', 'toa-node.js')], {
    cwd: join(FIXTURES, 'shop.probe'),
    env: { ...process.env, TOA_PORT: String(port), TOA_AGENT: 'http://127.0.0.1:1', TOA_COMPONENT: 'shop.probe' },
    stdio: 'ignore'
  })
  const exited = new Promise((resolve) => program.once('exit', (code, signal) => resolve(signal ?? code)))
  const described = () => fetch(`http://127.0.0.1:${port}/program`).then((r) => r.ok, () => false)
  await until(described, 10_000, 'the program serves')
  program.kill('SIGINT')
  await new Promise((resolve) => setTimeout(resolve, 300))
  assert.equal(await described(), true, 'still serving after SIGINT')
  program.kill('SIGTERM')
  const how = await Promise.race([exited, new Promise((resolve) => setTimeout(() => resolve('still running'), 5000))])
  assert.notEqual(how, 'still running', 'SIGTERM stops it')
})

test("a secret's place in the configuration gets its value; one without a value stops the program, naming it", async () => {
  const { Context } = await import('../lib/context.js')
  const env = {
    TOA_AGENT: 'http://127.0.0.1:1',
    TOA_COMPONENT: 'shop.c',
    TOA_CONFIGURATION: '{"key": "$MAIL_KEY", "list": [1, "$OTHER", "$lower"], "plain": "x"}',
    TOA_SECRET_MAIL_KEY: 'k-value',
    TOA_SECRET_OTHER: 'o-value'
  }
  assert.deepEqual(new Context(env).configuration, { key: 'k-value', list: [1, 'o-value', '$lower'], plain: 'x' })
  delete env.TOA_SECRET_OTHER
  assert.throws(() => new Context(env), /TOA_CONFIGURATION\/list\/1: the secret \$OTHER has no value: TOA_SECRET_OTHER is not set/)

  const program = spawn('node', [join(HERE, '..', 'bin', 'toa-node.js')], {
    cwd: join(FIXTURES, 'shop.probe'),
    env: { ...process.env, TOA_PORT: String(await freePort()), TOA_AGENT: 'http://127.0.0.1:1', TOA_COMPONENT: 'shop.probe', TOA_CONFIGURATION: '{"key": "$MAIL_KEY"}' },
    stdio: ['ignore', 'ignore', 'pipe']
  })
  let stderr = ''
  program.stderr.on('data', (chunk) => { stderr += chunk })
  const code = await new Promise((resolve) => program.once('exit', resolve))
  assert.equal(code, 1)
  assert.match(stderr, /TOA_SECRET_MAIL_KEY is not set/)
})

describe('only the agent', () => {
  // A program that knows its token answers only requests that carry it, as the agent's do: no
  // other process in the pod can run its run commands or operations.
  test('requests without the component\'s token are refused', async () => {
    const port = await freePort()
    const program = spawn(process.execPath, ['../../../bin/toa-node.js'], {
      cwd: `${FIXTURES}/shop.probe`,
      env: {
        ...process.env,
        TOA_PORT: String(port),
        TOA_AGENT: 'http://127.0.0.1:1',
        TOA_COMPONENT: 'shop.probe',
        TOA_AGENT_TOKEN: 'the-token'
      },
      stdio: 'ignore'
    })
    after(() => program.kill())
    const ask = async (method, path, token, payload = '{}') => {
      const headers = { 'content-type': 'application/json' }
      if (token !== undefined) headers.authorization = `Bearer ${token}`
      const body = method === 'POST' ? payload : undefined
      return (await fetch(`http://127.0.0.1:${port}${path}`, { method, headers, body })).status
    }
    await until(() => ask('GET', '/program', 'the-token').then((s) => s === 200, () => false), 20_000, 'the program serves')
    assert.equal(await ask('GET', '/program'), 401)
    assert.equal(await ask('POST', '/lifecycle/dispose'), 401)
    assert.equal(await ask('POST', '/operations/echo', 'another-token'), 401)
    assert.equal(await ask('POST', '/operations/echo', 'the-token'), 200)
    // A call whose caller stopped waiting does not reach the operation: 504.
    const withDeadline = (ms) => JSON.stringify({ input: {}, call: { id: 'c', deadline_ms: ms } })
    assert.equal(await ask('POST', '/operations/echo', 'the-token', withDeadline(Date.now() - 1)), 504)
    assert.equal(await ask('POST', '/operations/echo', 'the-token', withDeadline(Date.now() + 60_000)), 200)
  })
})
