// What the seed leaves to the reader: the terminal's driver (`open`), and the entity, which this
// port keeps in a JSON file every process of the component shares ($TERMINALS_STORE, by default
// toa-terminals.json in the temporary directory). An address `slow:MS` answers a charge after MS.
import { readFileSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

export async function open (address: string) {
  const delay = address.startsWith('slow:') ? Number(address.slice(5)) : 0
  return {
    async charge (amount: number) {
      await sleep(delay)
      return { charged: amount }
    },
    async close () {}
  }
}

const path = () => process.env.TERMINALS_STORE ?? join(tmpdir(), 'toa-terminals.json')

function all (): Record<string, unknown> {
  try {
    return JSON.parse(readFileSync(path(), 'utf8'))
  } catch {
    return {}
  }
}

export const store = {
  read: (id: string) => all()[id] ?? null,
  write: (id: string, value: unknown) => writeFileSync(path(), JSON.stringify({ ...all(), [id]: value }))
}
