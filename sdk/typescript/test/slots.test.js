// `slots` is answered from the onassigned stream, synchronously. A stuck agent is what this checks,
// so the stream comes from a server that writes what the test tells it and then falls silent.

import assert from 'node:assert/strict'
import http from 'node:http'
import { after, test } from 'node:test'
import { Context, SILENCE_MS } from '../lib/context.js'
import { until } from './helpers.js'

const streams = []
const server = http.createServer((request, response) => {
  response.writeHead(200, { 'content-type': 'application/x-ndjson' })
  streams.push(response)
})
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
const context = new Context({ TOA_AGENT: `http://127.0.0.1:${server.address().port}`, TOA_COMPONENT: 'shop.slots', TOA_INSTANCE: 'p1' })
context.atom.assignments.follow()
after(() => {
  context.atom.assignments.stop()
  server.closeAllConnections()
  server.close()
})

const send = (assignment) => streams.at(-1).write(JSON.stringify({ listener: 1, assignment }) + '\n')

test('slots follow the assignment at once, and answer null once the agent is silent', async () => {
  await until(() => streams.length === 1, 5000, 'the stream opened')
  assert.equal(context.atom.slots(8), null, 'nothing heard yet')
  send({ i: 1, n: 3, epoch: 7 })
  await until(() => context.atom.slots(8), 1000, 'the assignment')
  assert.deepEqual(context.atom.slots(8), [1, 4, 7])
  send(null)
  await until(() => context.atom.slots(8) === null, 100, 'a revoked assignment gone at once')
  send({ i: 0, n: 2, epoch: 8 })
  await until(() => context.atom.slots(4), 1000, 'assigned again')
  const silent = Date.now()
  streams.at(-1).write('\n') // a keep-alive counts as heard
  await until(() => context.atom.slots(4) === null, SILENCE_MS + 1000, 'null after silence')
  assert.ok(Date.now() - silent >= SILENCE_MS - 50, 'not before the silence bound')
})
