// Calls `credit`, which declares `once`, from a transition that retries: refused by the agent;
// the refusal is returned as the printed exception, and nothing is written.
export async function transition (input: { to: string }, entry: { balance: number, DISCARD?: boolean }, context: any) {
  try {
    await context.local.credit({ query: { id: input.to }, input: { amount: entry.balance } })
  } catch (error) {
    entry.DISCARD = true

    return { refused: String(error) }
  }

  entry.balance = 0

  return entry
}
