export async function transition (input: { amount: number }, entry: { balance: number }) {
  entry.balance += input.amount

  return { balance: entry.balance }
}
