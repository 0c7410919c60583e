// What the seeds leave to the reader: the mail provider's client and the queue's partitions.
// With $MAILER_RECORD set, the client appends what it does to that file (`sent`, `closed`).
import { appendFileSync } from 'node:fs'
import type { Configuration, Context } from './types/index.d.ts'

const record = (line: string) => {
  if (process.env.MAILER_RECORD) appendFileSync(process.env.MAILER_RECORD, line + '\n')
}

export async function connect (configuration: Configuration) {
  // Not the password itself: that it came, and its length.
  const password = configuration.password === undefined ? '' : ` with a password of ${configuration.password.length}`
  record(`connected ${configuration.provider} ${configuration.batch}${password}`)
  return {
    async send (to: string, text: string) { record(`sent ${to}`) },
    async close () { record('closed') }
  }
}

export async function drain (partition: number, context: Context) {
  context.state.drained = (context.state.drained ?? 0) + 1
}
