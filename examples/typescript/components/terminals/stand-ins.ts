// What the seed leaves to the reader: the terminal's driver (`open`). An address `slow:MS`
// answers a charge after MS.
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
