// What the seed leaves to the reader: collecting and submitting the settlement. Each submission
// is appended to $SETTLEMENTS (when set) with its start and end, so that a test can see that no
// two overlapped, and so is the start of each collection; collecting takes $SETTLE_COLLECT_MS
// (200 by default).
import { appendFileSync } from 'node:fs'
import type { Context } from './types/index.d.ts'

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

export async function collect (context: Context): Promise<string[]> {
  record({ instance: context.instance, collecting: Date.now() })
  await sleep(Number(process.env.SETTLE_COLLECT_MS ?? 200))
  return ['order-1', 'order-2']
}

export async function submit (batch: string[], context: Context) {
  const start = Date.now()
  await sleep(100)
  record({ instance: context.instance, batch, start, end: Date.now() })
}

function record (line: object) {
  if (process.env.SETTLEMENTS) appendFileSync(process.env.SETTLEMENTS, JSON.stringify(line) + '\n')
}
