// `slots` is answered from the onassigned stream, synchronously. A stuck agent is what this checks,
// so the stream comes from a server that writes what the test tells it and then falls silent.

import assert from 'node:assert/strict'
import http from 'node:http'
import { after, test } from 'node:test'
import { Context, SILENCE_MS } from '../lib/context.js'
import { until } from './helpers.js'

// Streams by component: `shop.slots` is the context whose `slots` stream the test follows,
// `shop.listen` the one whose listeners open theirs; either reopens its own whenever it ends.
const streams = { 'shop.slots': [], 'shop.listen': [] }
const failed = []
const server = http.createServer((request, response) => {
  const open = streams['shop.listen']
  if (request.method === 'POST') {
    // A listener's failure: told while its stream is still open?
    failed.push({ url: request.url, open: open.map((s) => !s.gone) })
    return response.end('{}')
  }
  response.writeHead(200, { 'content-type': 'application/x-ndjson' })
  response.on('close', () => { response.gone = true })
  streams[request.url.split('/')[2]].push(response)
})
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
const agent = (component) => new Context({ TOA_AGENT: `http://127.0.0.1:${server.address().port}`, TOA_COMPONENT: component, TOA_INSTANCE: 'p1' })
const context = agent('shop.slots')
const listening = agent('shop.listen')
context.atom.assignments.follow()
after(() => {
  context.atom.assignments.stop()
  server.closeAllConnections()
  server.close()
})

const slotStreams = streams['shop.slots']
const listenerStreams = streams['shop.listen']
const send = (assignment) => slotStreams.at(-1).write(JSON.stringify({ listener: 1, assignment }) + '\n')

test('slots follow the assignment at once, and answer null once the agent is silent', async () => {
  await until(() => slotStreams.length === 1, 5000, 'the stream opened')
  assert.equal(context.atom.slots(8), null, 'nothing heard yet')
  send({ i: 1, n: 3, epoch: 7 })
  await until(() => context.atom.slots(8), 1000, 'the assignment')
  assert.deepEqual(context.atom.slots(8), [1, 4, 7])
  send(null)
  await until(() => context.atom.slots(8) === null, 100, 'a revoked assignment gone at once')
  send({ i: 0, n: 2, epoch: 8 })
  await until(() => context.atom.slots(4), 1000, 'assigned again')
  const silent = Date.now()
  slotStreams.at(-1).write('\n') // a keep-alive counts as heard
  await until(() => context.atom.slots(4) === null, SILENCE_MS + 1000, 'null after silence')
  assert.ok(Date.now() - silent >= SILENCE_MS - 50, 'not before the silence bound')
  // A silent stream may be half-open: it is closed, and a new one opened.
  await until(() => slotStreams.length === 2, SILENCE_MS + 2000, 'a new stream after the silence')
  assert.ok(slotStreams[0].gone, 'the silent one closed')
  send({ i: 1, n: 2, epoch: 9 })
  await until(() => context.atom.slots(4), 1000, 'assigned on the new stream')
  assert.deepEqual(context.atom.slots(4), [1, 3])
})

test('a listener hears the share lost when its stream ends, and again once it is back', async () => {
  const heard = []
  const before = listenerStreams.length
  const off = listening.atom.onassigned((assignment) => { heard.push(assignment) })
  await until(() => listenerStreams.length === before + 1, 5000, 'the listener\'s stream')
  listenerStreams.at(-1).write(JSON.stringify({ listener: 2, assignment: { i: 0, n: 1, epoch: 1 } }) + '\n')
  listenerStreams.at(-1).write(JSON.stringify({ listener: 2, assignment: { i: 0, n: 1, epoch: 1 } }) + '\n')
  await until(() => heard.length === 1, 1000, 'the assignment')
  listenerStreams.at(-1).end() // the agent restarted, say
  await until(() => heard.length === 2, 1000, 'null once the stream ended')
  assert.equal(heard[1], null)
  await until(() => listenerStreams.length === before + 2, 5000, 'the stream opened again')
  listenerStreams.at(-1).write(JSON.stringify({ listener: 3, assignment: { i: 0, n: 1, epoch: 1 } }) + '\n')
  await until(() => heard.length === 3, 1000, 'the assignment again')
  assert.deepEqual(heard[2], { i: 0, n: 1, epoch: 1 }, 'a repeat within one stream was not told twice')
  off()
})

test('a listener that throws is reported while its stream is open; a line that is not JSON ends a stream', async () => {
  const before = listenerStreams.length
  listening.atom.onassigned(() => { throw new Error('on purpose') })
  await until(() => listenerStreams.length === before + 1, 5000, 'the listener\'s stream')
  const mine = listenerStreams.length - 1
  listenerStreams[mine].write(JSON.stringify({ listener: 9, assignment: { i: 0, n: 1, epoch: 1 } }) + '\n')
  await until(() => failed.length === 1, 2000, 'the failure told')
  assert.equal(failed[0].url, '/v1/shop.listen/onassigned/9/failed')
  assert.equal(failed[0].open[mine], true, 'told while the listener\'s stream was open')
  await until(() => listenerStreams[mine].gone, 2000, 'then closed')
  // The slots' own stream: garbage ends it at once, well before the silence would (the process
  // goes on), and another is opened.
  await until(() => !slotStreams.at(-1).gone, 5000, 'a slots stream open')
  const garbled = slotStreams.at(-1)
  const count = slotStreams.length
  garbled.write('\n')
  garbled.write('not json\n')
  await until(() => garbled.gone, SILENCE_MS / 2, 'the stream closed on the garbage')
  await until(() => slotStreams.length > count, 5000, 'a new stream after the garbage')
})
