// docs/first-project.md, followed line by line: its commands, as written, in an empty directory
// (this repository's path for `~/toa`, the tests' agent for its build).

import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { test } from 'node:test'
import { init } from '../lib/init.js'
import { AGENT, ROOT, scratch } from './helpers.js'

const PAGE = join(ROOT, 'docs', 'first-project.md')

/** The page's commands: the sh block after its marker. */
function commands () {
  const page = readFileSync(PAGE, 'utf8')
  const block = /<!-- first-project: the commands -->\n```sh\n([^]*?)```/.exec(page)
  assert.ok(block, `${PAGE} has its commands' block`)
  return block[1]
    .replace('~/toa/target/debug/toa-agent', AGENT)
    .replaceAll('~/toa', ROOT)
}

test('docs/first-project.md, as written: init, types, check, restart, two calls, stop', () => {
  const dir = scratch('toa-first-')
  // Each line echoed before it runs, so that each command's output can be told apart.
  const script = commands().split('\n').filter(Boolean).map((line) => `echo "### ${line.replaceAll('"', '\\"')}"\n${line}`).join('\n')
  const run = spawnSync('bash', ['-c', script], { cwd: dir, encoding: 'utf8', timeout: 300_000 })
  const out = run.stdout
  const step = (prefix) => {
    const start = out.indexOf(`### ${prefix}`)
    assert.notEqual(start, -1, `ran: ${prefix}\n${out}\n${run.stderr}`)
    const end = out.indexOf('### ', start + 4)
    return out.slice(start, end === -1 ? undefined : end)
  }
  assert.match(step('npx toa init'), /wrote components\/hello\.greeter\/operations\/greet\.ts/)
  assert.doesNotMatch(step('npm run check'), /error TS/, run.stderr)
  assert.match(step('npm run restart'), /Composition complete/, run.stderr)
  assert.match(step("npx toa call hello.greeter.greet \"{ input: { name: 'Ann' } }\""), /"greeting": "Hello, Ann"/)
  assert.match(step("npx toa call hello.greeter.greet \"{ input: { name: '' } }\""), /"code": "NO_NAME"/)
  assert.match(step('npm stop'), /stopped \(pid \d+\)/)
  assert.equal(run.status, 0, `the page's last command succeeds\n${out}\n${run.stderr}`)
  const types = readFileSync(join(dir, 'hello', 'components', 'hello.greeter', 'types', 'index.d.ts'), 'utf8')
  assert.match(types, /export type GreetError = OperationError<"NO_NAME">/, 'an error type with its code')
})

test('init overwrites nothing, and refuses before writing anything', () => {
  const dir = scratch('toa-init-')
  writeFileSync(join(dir, 'tsconfig.json'), '{ "mine": true }\n')
  assert.throws(() => init(dir), /init writes nothing over what exists: tsconfig\.json already here/)
  assert.equal(readFileSync(join(dir, 'tsconfig.json'), 'utf8'), '{ "mine": true }\n')
  assert.throws(() => readFileSync(join(dir, 'context.toa.yaml')), /ENOENT/, 'nothing else written')

  const other = scratch('toa-init-')
  writeFileSync(join(other, 'package.json'), JSON.stringify({ name: 'x', scripts: { stop: 'pm2 stop app' } }))
  assert.throws(() => init(other), /package\.json has other scripts named stop/)
  assert.throws(() => readFileSync(join(other, 'tsconfig.json')), /ENOENT/)
})
