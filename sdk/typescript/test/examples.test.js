// The seeds' examples (examples/typescript), ported to this SDK, under the real agent: each gives
// the seeds' answers. Needs `npm ci` in examples/typescript (its node_modules/.bin/toa-node is the
// components' program).

import assert from 'node:assert/strict'
import { spawn, spawnSync } from 'node:child_process'
import { cpSync, existsSync, readdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { after, describe, test } from 'node:test'
import { compose } from '../lib/stage.js'
import { AGENT, COMPONENTS, EXAMPLES, contextFile, redis, scratch, tsc, until } from './helpers.js'

const lines = (path) => existsSync(path)
  ? readFileSync(path, 'utf8').split('\n').filter(Boolean).map((line) => JSON.parse(line))
  : []

const stages = []
const start = async (components, options = {}) => {
  const stage = await compose(components.map((c) => join(COMPONENTS, c)), { agent: AGENT, ...options })
  stages.push(stage)
  return stage
}
after(async () => { await Promise.all(stages.map((stage) => stage.stop())) })

describe('store.catalog', () => {
  test('the eleventh appraisal within a minute is refused', async () => {
    const stage = await start(['store.catalog'])
    const answers = []
    for (let i = 0; i < 11; i++) answers.push(await stage.call('store.catalog.appraise', { input: { customer: 'c1', product: 'a1' } }))
    assert.deepEqual(answers.slice(0, 10), Array(10).fill({ product: 'a1', price: 42 }))
    assert.ok(answers[10] instanceof Error)
    assert.equal(answers[10].code, 'TOO_MANY_REQUESTS')
  })

  test('a halt pauses the poller and a restore resumes it with the same state', async () => {
    const stage = await start(['store.catalog'])
    const polls = async () => (await stage.call('store.catalog.polls')).polls
    await until(async () => (await polls()) >= 2, 5000, 'two polls')
    await stage.halt()
    const paused = await polls()
    // Seed: pause stops the timer; 2.5 polling intervals pass without a poll.
    await new Promise((resolve) => setTimeout(resolve, 2500))
    assert.equal(await polls(), paused, 'no poll while halted')
    await stage.restore()
    const resumed = await until(async () => { const n = await polls(); return n > paused && n }, 5000, 'a poll after restore')
    assert.equal(resumed, paused + 1, 'counting on from the same context.state, not from 0')
  })

  test('price fills context.state on first use', async () => {
    const stage = await start(['store.catalog'])
    assert.deepEqual(await stage.call('store.catalog.price', { input: { product: 'p1' } }), { product: 'p1', price: 42 })
  })
})

describe('store.orders settle', () => {
  test('three concurrent settlements run one at a time, with increasing tokens', async () => {
    const settlements = join(scratch(), 'settlements')
    const stage = await start(['store.orders'], { env: { SETTLEMENTS: settlements } })
    const replies = await Promise.all([1, 2, 3].map(() => stage.call('store.orders.settle')))
    const submitted = lines(settlements).filter((line) => line.end).sort((a, b) => a.start - b.start)
    assert.equal(submitted.length, 3)
    for (let i = 1; i < submitted.length; i++) assert.ok(submitted[i - 1].end <= submitted[i].start, JSON.stringify(submitted))
    const tokens = replies.map((reply) => reply.token).sort((a, b) => a - b)
    assert.equal(new Set(tokens).size, 3, `three holders: ${tokens}`)
    assert.ok(replies.every((reply) => reply.submitted === 2))
  })

  test('the signal aborts when Redis is stopped under the holder, and nothing is submitted', async () => {
    const server = await redis()
    try {
      const settlements = join(scratch(), 'settlements')
      const context = contextFile(`name: sdk\natomicity:\n  redis: ${server.url}\n  interval: 1000\n  ttl: 2000\n`)
      const stage = await start(['store.orders'], { context, env: { SETTLEMENTS: settlements, SETTLE_COLLECT_MS: '8000' } })
      const settling = stage.call('store.orders.settle').then((reply) => ({ reply }), (error) => ({ error }))
      await until(() => lines(settlements).some((line) => line.collecting), 10_000, 'the lock held, collecting')
      server.stop()
      const outcome = await settling
      assert.ok(outcome.error, `the settlement failed: ${JSON.stringify(outcome)}`)
      await until(() => /lock on settlement was lost/.test(stage.output()), 5000, 'the lost signal\'s error logged')
      assert.deepEqual(lines(settlements).filter((line) => line.end), [], 'nothing submitted without the lock')
    } finally {
      server.kill()
    }
  })
})

describe('notifications', () => {
  test('slots(16): all alone, half with a second replica on the same Redis', async () => {
    const server = await redis()
    try {
      const context = contextFile(`name: sdk\natomicity:\n  redis: ${server.url}\n  interval: 500\n`)
      const one = await start(['notifications'], { context })
      const share = (stage) => stage.call('notifications.share')
      await until(async () => (await share(one))?.length === 16, 15_000, 'all 16 slots alone')
      const two = await start(['notifications'], { context })
      const [a, b] = await until(async () => {
        const shares = [await share(one), await share(two)]
        return shares.every((s) => s?.length === 8) && shares
      }, 15_000, 'eight slots each')
      assert.deepEqual([...a, ...b].sort((x, y) => x - y), [...Array(16).keys()], 'disjoint, and together all 16')
      // Revoked: once the second replica stops, the first owns all again.
      await two.stop()
      await until(async () => (await share(one))?.length === 16, 15_000, 'all 16 again')
    } finally {
      server.kill()
    }
  })

  test("the mailer connects with the configuration and its dispose runs on stop", async () => {
    const record = join(scratch(), 'mailer')
    const context = contextFile('name: sdk\nconfiguration:\n  notifications:\n    provider: smtp://mail.test\n')
    const stage = await start(['notifications'], { context, env: { MAILER_RECORD: record } })
    assert.equal(await stage.call('notifications.send', { input: { to: 'ann@example.com', text: 'Hello' } }), null)
    await stage.stop()
    assert.deepEqual(readFileSync(record, 'utf8').split('\n').filter(Boolean),
      ['connected smtp://mail.test 50', 'sent ann@example.com', 'closed'],
      "the context's provider, the manifest's default batch; dispose ran")
  })

  test("a secret's value comes from the environment, is checked, and is never repeated", async () => {
    const record = join(scratch(), 'mailer')
    const context = contextFile('name: sdk\nconfiguration:\n  notifications:\n    password: $MAILER_PASSWORD\n')
    const password = 'correct horse battery' // 21 characters; its placeholder has 16
    const stage = await start(['notifications'], { context, env: { MAILER_RECORD: record, MAILER_PASSWORD: password } })
    await stage.stop()
    assert.equal(readFileSync(record, 'utf8').split('\n')[0], 'connected smtp://localhost:2525 50 with a password of 21')

    const short = await start(['notifications'], { context, env: { MAILER_PASSWORD: 'tiny7' } }).then(() => null, (error) => error)
    assert.ok(short, 'it started with a password the schema refuses')
    assert.match(short.message, /notifications: configuration\/password: the value of \$MAILER_PASSWORD is shorter than 8 characters/)
    assert.ok(!short.message.includes('tiny7'), 'the value was repeated')
    // An undefined value leaves the variable out, even if the test's own environment has it.
    const missing = await start(['notifications'], { context, env: { MAILER_PASSWORD: undefined } }).then(() => null, (error) => error)
    assert.ok(missing, 'it started without the password')
    assert.match(missing.message, /the secret \$MAILER_PASSWORD has no value: set the environment variable MAILER_PASSWORD/)
  })

  test('a configuration value the schema refuses stops the start, naming it', async () => {
    const context = contextFile('name: sdk\nconfiguration:\n  notifications:\n    batch: 0\n')
    const error = await start(['notifications'], { context }).then(() => null, (error) => error)
    assert.ok(error, 'it started')
    assert.match(error.message, /notifications: configuration\/batch: 0 is less than the minimum of 1/)
  })
})

describe('store.orders pay', () => {
  test('a killed terminal process is TERMINAL_OFFLINE, a timed-out charge TERMINAL_UNCERTAIN', async () => {
    // The terminals and the orders keep their objects in entities: over a broker, in the
    // PostgreSQL scripts/services starts (terminals named for this run: the store outlives it).
    const context = contextFile('name: sdk-pay\namqp: amqp://localhost\nstorage: postgres://127.0.0.1:5432/toa\naddressed:\n  timeout: 1500\n')
    const env = { TOA_STORAGE_USERNAME: 'toa', TOA_STORAGE_PASSWORD: 'toa' }
    const [t1, t2] = [`t1-${process.pid}`, `t2-${process.pid}`]
    // Two terminals processes: one holds the terminal, the other answers `observe` once it died.
    const tills = new Map()
    for (const name of ['till-1', 'till-2']) {
      tills.set(`${name}-${process.pid}`, await start(['terminals'], { context, env: { ...env, TOA_INSTANCE: `${name}-${process.pid}` } }))
    }
    const orders = await start(['store.orders'], { context, env })
    const [till] = tills.values()
    await till.call('terminals.connect', { input: { terminal: t1, address: 'fast' } })
    await till.call('terminals.connect', { input: { terminal: t2, address: 'slow:5000' } })
    assert.deepEqual(await orders.call('store.orders.pay', { input: { terminal: t1, amount: 5 } }), { charged: 5 })
    const uncertain = await orders.call('store.orders.pay', { input: { terminal: t2, amount: 5 } })
    assert.equal(uncertain.code, 'TERMINAL_UNCERTAIN')
    // The holder as the entity records it (the inherited observe).
    const terminal = await till.call('terminals.observe', { query: { id: t1 } })
    const holder = tills.get(terminal.holder)
    assert.ok(holder, JSON.stringify(terminal))
    holder.child.kill('SIGKILL')
    await holder.exited
    const offline = await orders.call('store.orders.pay', { input: { terminal: t1, amount: 5 } })
    assert.equal(offline.code, 'TERMINAL_OFFLINE')
  })
})

describe('a seed manifest as written', () => {
  test('without `program:` the TypeScript SDK runs it, found in the project\'s node_modules', async () => {
    const copy = join(scratch(), 'examples')
    cpSync(EXAMPLES, copy, { recursive: true, filter: (path) => !path.includes('node_modules') })
    symlinkSync(join(EXAMPLES, 'node_modules'), join(copy, 'node_modules'))
    const manifest = join(copy, 'components', 'fulfilment.stock', 'manifest.toa.yaml')
    const written = readFileSync(manifest, 'utf8')
    writeFileSync(manifest, written.replace(/^program: .*\n/m, ''))
    assert.doesNotMatch(readFileSync(manifest, 'utf8'), /^program:/m)
    const stage = await compose([join(copy, 'components', 'fulfilment.stock')], { agent: AGENT })
    stages.push(stage)
    await stage.call('fulfilment.stock.transit', { query: { id: 'k1' }, input: { available: 1 } })
    const sold = await stage.call('fulfilment.stock.reserve', { query: { id: 'k1' }, input: { quantity: 1 } })
    assert.equal(sold.available, 0, JSON.stringify(sold))
  })
})

describe('types', () => {
  test('the generated types are current, and the examples type-check with --strict', () => {
    const copy = join(scratch(), 'examples')
    cpSync(EXAMPLES, copy, { recursive: true, filter: (path) => !path.includes('node_modules') })
    const components = readdirSync(join(EXAMPLES, 'components')).sort()
    const generated = spawnSync(join(EXAMPLES, 'node_modules', '.bin', 'toa-node'), ['types', ...components.map((c) => join(copy, 'components', c))], { encoding: 'utf8' })
    assert.equal(generated.status, 0, generated.stderr)
    for (const component of components) {
      const path = join('components', component, 'types', 'index.d.ts')
      assert.equal(readFileSync(join(copy, path), 'utf8'), readFileSync(join(EXAMPLES, path), 'utf8'), `${path} is current (npm run types)`)
    }
    const checked = tsc(EXAMPLES)
    assert.equal(checked.status, 0, checked.stdout + checked.stderr)
  })

  /** The type check of a copy of the examples with `from` written `to` in one file. */
  const misspelt = (file, from, to) => {
    const copy = join(scratch(), 'examples')
    cpSync(EXAMPLES, copy, { recursive: true, filter: (path) => !path.includes('node_modules') })
    symlinkSync(join(EXAMPLES, 'node_modules'), join(copy, 'node_modules'))
    const path = join(copy, 'components', file)
    writeFileSync(path, readFileSync(path, 'utf8').replace(from, to))
    return tsc(copy)
  }

  test('a wrong input field fails the check, naming it', () => {
    const checked = misspelt('store.catalog/operations/appraise.ts', 'input.customer', 'input.customr')
    assert.notEqual(checked.status, 0)
    assert.match(checked.stdout, /appraise\.ts.*customr/)
  })

  test("a property the entity does not declare fails the check: State is the entity's", () => {
    const checked = misspelt('fulfilment.stock/operations/reserve.ts', 'entry.available -=', 'entry.availble -=')
    assert.notEqual(checked.status, 0)
    assert.match(checked.stdout, /reserve\.ts.*availble/)
  })
})

describe('store.orders approve and billing.wallets debit (seed 003, What a second run repeats)', () => {
  test('two clicks on Approve take the money once: the debit is keyed by the order', async () => {
    const stage = await start(['store.orders', 'billing.wallets'])
    await stage.call('billing.wallets.transit', { query: { id: 'c1' }, input: { balance: 100 } })
    const order = await stage.call('store.orders.transit', { input: { status: 'pending', customer: 'c1', total: 30 } })
    assert.match(order.id, /^[0-9a-f]{32}$/, 'a new order gets an id of its own')
    // One process takes turns on an order, so here the second click runs after the first was
    // stored and discards; across replicas its first run may call debit too, which the ref keys
    // (the repeated debit below shows that part).
    const clicks = await Promise.all([1, 2].map(() => stage.call('store.orders.approve', { query: { id: order.id } })))
    assert.deepEqual(clicks.map((approved) => approved.status), ['approved', 'approved'])
    const wallet = await stage.call('billing.wallets.observe', { query: { id: 'c1' } })
    assert.deepEqual({ balance: wallet.balance, paid: wallet.paid }, { balance: 70, paid: { [order.id]: 30 } })
    const approved = await stage.call('store.orders.observe', { query: { id: order.id } })
    assert.equal(approved.VERSION, 2, 'stored once; the second click was discarded')
    // A debit asked again for the same order: DISCARD, the balance answered, nothing taken.
    const again = await stage.call('billing.wallets.debit', { query: { id: 'c1' }, input: { amount: 30, ref: order.id } })
    assert.deepEqual(again, { balance: 70 })
    assert.equal((await stage.call('billing.wallets.observe', { query: { id: 'c1' } })).VERSION, 2)
    // A customer without the money: the wallet's error is approve's, and the order stays pending.
    const unpaid = await stage.call('store.orders.transit', { input: { status: 'pending', customer: 'c2', total: 30 } })
    const refused = await stage.call('store.orders.approve', { query: { id: unpaid.id } })
    assert.ok(refused instanceof Error, JSON.stringify(refused))
    assert.equal(refused.code, 'INSUFFICIENT_FUNDS')
    assert.equal((await stage.call('store.orders.observe', { query: { id: unpaid.id } })).status, 'pending')
  })
})

describe('store.orders approve across two replicas (seed 003, What a second run repeats)', () => {
  test('ten orders, each approved by two processes at once on one PostgreSQL: each stored once, the money taken once', async () => {
    // Two processes of one application: their writes to an order or the wallet race for real
    // (one process takes turns on an object; two do not), so a lost write runs approve again,
    // which calls debit again, which the order's ref discards.
    const context = contextFile(`name: sdk-approve-${process.pid}\nstorage: postgres://127.0.0.1:5432/toa\n`)
    const env = { TOA_STORAGE_USERNAME: 'toa', TOA_STORAGE_PASSWORD: 'toa' }
    const replicas = [await start(['store.orders', 'billing.wallets'], { context, env }),
      await start(['store.orders', 'billing.wallets'], { context, env })]
    await replicas[0].call('billing.wallets.transit', { query: { id: 'c1' }, input: { balance: 1000 } })
    const orders = []
    for (let i = 0; i < 10; i++) {
      orders.push(await replicas[i % 2].call('store.orders.transit', { input: { status: 'pending', customer: 'c1', total: 10 + i } }))
    }
    const approvals = await Promise.all(orders.flatMap((order) =>
      replicas.map((replica) => replica.call('store.orders.approve', { query: { id: order.id } }))))
    assert.deepEqual(new Set(approvals.map((approved) => approved.status)), new Set(['approved']), JSON.stringify(approvals))
    for (const order of orders) {
      const stored = await replicas[1].call('store.orders.observe', { query: { id: order.id } })
      assert.deepEqual({ status: stored.status, VERSION: stored.VERSION }, { status: 'approved', VERSION: 2 }, 'stored once')
    }
    const wallet = await replicas[0].call('billing.wallets.observe', { query: { id: 'c1' } })
    const taken = orders.reduce((sum, order) => sum + order.total, 0)
    assert.equal(wallet.balance, 1000 - taken, 'each order paid once')
    assert.deepEqual(wallet.paid, Object.fromEntries(orders.map((order) => [order.id, order.total])))
    assert.equal(wallet.VERSION, 1 + orders.length, 'one stored debit per order: every repeat discarded')
  })
})

describe('store.orders events (seed 003, Leave the call to an event; seed 001, a receiver bound to a stateful operation)', () => {
  test('an approval mails once, a cancellation credits the wallet once and voids on the holding process', async () => {
    const dir = scratch()
    const [mail, tills] = [join(dir, 'mail'), join(dir, 'tills')]
    const stage = await start(['store.orders', 'billing.wallets', 'notifications', 'terminals'], { env: { MAILER_RECORD: mail, TERMINALS_RECORD: tills } })
    const recorded = (path, prefix) => existsSync(path) ? readFileSync(path, 'utf8').split('\n').filter((line) => line.startsWith(prefix)) : []
    await stage.call('terminals.connect', { input: { terminal: 't1', address: 'till-a' } })
    const { holder } = await stage.call('terminals.observe', { query: { id: 't1' } })
    await stage.call('billing.wallets.transit', { query: { id: 'c1' }, input: { balance: 100 } })
    const order = await stage.call('store.orders.transit', { input: { customer: 'c1', total: 30, terminal: 't1', holder } })
    for (let click = 0; click < 2; click++) await stage.call('store.orders.approve', { query: { id: order.id } })
    assert.equal((await stage.call('billing.wallets.observe', { query: { id: 'c1' } })).balance, 70)
    await until(() => recorded(mail, 'sent').length > 0, 10_000, 'the approval mailed')
    for (let click = 0; click < 2; click++) await stage.call('store.orders.cancel', { query: { id: order.id } })
    const wallet = await until(async () => { const w = await stage.call('billing.wallets.observe', { query: { id: 'c1' } }); return w.balance === 100 && w }, 10_000, 'the wallet credited')
    await until(() => recorded(tills, 'voided').length > 0, 10_000, 'the charge voided on the holding process')
    // Versions: 1 the transit, 2 the debit, 3 the credit; once each.
    assert.equal(wallet.VERSION, 3, JSON.stringify(wallet))
    assert.deepEqual(recorded(mail, 'sent'), ['sent c1'], 'one mail: the second approval was discarded, and a later change is no approval')
    assert.deepEqual(recorded(tills, 'voided'), ['voided till-a'])
    // A pending order cancelled took nothing: no event, nothing credited (its condition).
    const pending = await stage.call('store.orders.transit', { input: { customer: 'c1', total: 5, terminal: 't1', holder } })
    await stage.call('store.orders.cancel', { query: { id: pending.id } })
    const after = await stage.call('store.orders.transit', { input: { customer: 'c1', total: 7, terminal: 't1', holder } })
    await stage.call('store.orders.approve', { query: { id: after.id } })
    await until(() => recorded(mail, 'sent').length === 2, 10_000, 'the second approval mailed')
    assert.equal((await stage.call('billing.wallets.observe', { query: { id: 'c1' } })).balance, 93)
  })
})

describe('fulfilment.shipments book (seed 003, When a lock is the answer)', () => {
  test('three bookings of one order at once reach the carrier once, and read again inside the lock', async () => {
    const bookings = join(scratch(), 'bookings')
    const stage = await start(['fulfilment.shipments'], { env: { BOOKINGS: bookings } })
    const book = () => stage.call('fulfilment.shipments.book', { input: { order: 'o1' } })
    const answers = await Promise.all([book(), book(), book()])
    assert.deepEqual(answers.map((shipment) => shipment.booking), Array(3).fill('parcel-o1'))
    assert.equal(lines(bookings).length, 1, 'the carrier was asked once')
    const shipment = await stage.call('fulfilment.shipments.observe', { query: { id: 'o1' } })
    assert.deepEqual(shipment, { id: 'o1', booking: 'parcel-o1', VERSION: 1 })
  })
})

describe('fulfilment.stock (seed 003, Two Writers at Once)', () => {
  const kettle = { id: 'c0ffee00c0ffee00c0ffee00c0ffee00' }

  test("the seed's Try it: one unit, two reservations at once, one OUT_OF_STOCK", async () => {
    const stage = await start(['fulfilment.stock'])
    const stocked = await stage.call('fulfilment.stock.transit', { query: kettle, input: { available: 1 } })
    assert.deepEqual(stocked, { ...kettle, available: 1, VERSION: 1 })
    const reserve = () => stage.call('fulfilment.stock.reserve', { query: kettle, input: { quantity: 1 } })
    const answers = await Promise.all([reserve(), reserve()])
    const sold = answers.filter((answer) => !(answer instanceof Error))
    const refused = answers.filter((answer) => answer instanceof Error)
    assert.deepEqual(sold, [{ ...kettle, available: 0, VERSION: 2 }])
    assert.deepEqual(refused.map((error) => error.code), ['OUT_OF_STOCK'])
    assert.deepEqual(await stage.call('fulfilment.stock.observe', { query: kettle }), { ...kettle, available: 0, VERSION: 2 })
  })

  test("the seed's Try it, typed as the seed types it, through toa-agent call", async () => {
    const stage = await start(['fulfilment.stock'])
    const agent = `http://127.0.0.1:${stage.port}`
    /** `toa-agent call TARGET REQUEST`: its exit status and what it printed. */
    const call = (target, request) => new Promise((resolve) => {
      const child = spawn(AGENT, ['call', target, request, '--agent', agent])
      let printed = ''
      child.stdout.on('data', (chunk) => { printed += chunk })
      child.on('close', (status) => resolve({ status, answer: JSON.parse(printed) }))
    })
    const id = "{ id: 'c0ffee00c0ffee00c0ffee00c0ffee00' }"
    const stocked = await call('fulfilment.stock.transit', `{ query: ${id}, input: { available: 1 } }`)
    assert.equal(stocked.status, 0)
    const reserve = () => call('fulfilment.stock.reserve', `{ query: ${id}, input: { quantity: 1 } }`)
    const answers = await Promise.all([reserve(), reserve()])
    const printed = answers.map(({ answer }) => answer.reply?.available ?? answer.error?.code).sort()
    assert.deepEqual(printed, [0, 'OUT_OF_STOCK'])
    assert.deepEqual(answers.map(({ status }) => status).sort(), [0, 1], 'the error exits 1')
  })

  test('400 reservations of 1 on a stock of 100: exactly 100 sold, the rest OUT_OF_STOCK', async () => {
    const stage = await start(['fulfilment.stock'])
    const item = { id: 'kettle-400' }
    await stage.call('fulfilment.stock.transit', { query: item, input: { available: 100 } })
    const answers = await Promise.all(Array.from({ length: 400 }, () =>
      stage.call('fulfilment.stock.reserve', { query: item, input: { quantity: 1 } })))
    const sold = answers.filter((answer) => !(answer instanceof Error))
    const codes = new Set(answers.filter((answer) => answer instanceof Error).map((error) => error.code))
    assert.equal(sold.length, 100)
    assert.deepEqual([...codes], ['OUT_OF_STOCK'])
    // Every sale stored its own version: none was stored twice, none lost.
    assert.deepEqual(sold.map((answer) => answer.VERSION).sort((a, b) => a - b), Array.from({ length: 100 }, (_, i) => i + 2))
    assert.deepEqual(await stage.call('fulfilment.stock.observe', { query: item }), { ...item, available: 0, VERSION: 101 })
  })

  test('a stale version, an input out of the schema, a missing query and an id out of the alphabet are refused; nothing is stored', async () => {
    const stage = await start(['fulfilment.stock'])
    const item = { id: 'kettle-edit' }
    await stage.call('fulfilment.stock.transit', { query: item, input: { available: 3 } })
    await assert.rejects(stage.call('fulfilment.stock.transit', { query: { ...item, version: 0 }, input: { available: 5 } }),
      (error) => error.code === 'PRECONDITION_FAILED' && /at version 1, not 0/.test(error.message))
    await assert.rejects(stage.call('fulfilment.stock.transit', { query: item, input: { available: -1 } }),
      (error) => error.code === 202 && /minimum of 0/.test(error.message))
    await assert.rejects(stage.call('fulfilment.stock.reserve', { input: { quantity: 1 } }),
      (error) => error.code === 202 && /`query`: reserve works on one object/.test(error.message))
    await assert.rejects(stage.call('fulfilment.stock.reserve', { query: { id: 'a/b' }, input: { quantity: 1 } }),
      (error) => error.code === 202 && /`query\.id`: expected 1 to 64/.test(error.message))
    assert.deepEqual(await stage.call('fulfilment.stock.observe', { query: item }), { ...item, available: 3, VERSION: 1 })
  })
})
