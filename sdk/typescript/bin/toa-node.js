#!/usr/bin/env node
// `toa-node`: the program of a component written in TypeScript or JavaScript (the manifest's
// `program: [toa-node]`): loads operations/ and rc/ from the current directory and serves the
// agent's protocol. `toa-node types DIR...`: writes each component's types/index.d.ts.
import { register as registerCjs } from 'tsx/cjs/api'
import { register } from 'tsx/esm/api'

const [command, ...args] = process.argv.slice(2)
if (command === 'types') {
  const { writeTypes } = await import('../lib/types.js')
  try {
    for (const written of writeTypes(args.length ? args : ['.'])) console.log(written)
  } catch (error) {
    console.error(`toa-node types: ${/** @type {Error} */ (error).message}`)
    process.exit(1)
  }
} else if (command === undefined) {
  // TypeScript without a build step: tsx compiles each module as it is imported, as an ES module
  // under a package.json with "type": "module", otherwise as CommonJS (both hooks are needed).
  registerCjs()
  register()
  const { main } = await import('../lib/runtime.js')
  await main()
} else {
  console.error(`toa-node: unknown command ${JSON.stringify(command)}; expected none (run the component here) or \`types DIR...\``)
  process.exit(2)
}
