#!/usr/bin/env node
// `toa`: the seeds' commands (`npx toa compose`, `npx toa call`, `npm run restart`, `npm stop`),
// run by toa-agent. `toa --help` lists them.
import { main } from '../lib/cli.js'

process.exitCode = await main(process.argv.slice(2))
