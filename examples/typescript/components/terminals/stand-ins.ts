// What the seed leaves to the reader: the terminal's driver (`open`). An address `slow:MS`
// answers a charge after MS. With $TERMINALS_RECORD set, a void is appended to that file.
import { appendFileSync } from 'node:fs'

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

export async function open (address: string) {
  const delay = address.startsWith('slow:') ? Number(address.slice(5)) : 0
  return {
    async charge (amount: number) {
      await sleep(delay)
      return { charged: amount }
    },
    async void () {
      if (process.env.TERMINALS_RECORD) appendFileSync(process.env.TERMINALS_RECORD, `voided ${address}\n`)
      return { voided: true }
    },
    async close () {}
  }
}
