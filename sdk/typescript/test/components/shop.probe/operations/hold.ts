// Seed 000's long holder: the lock `shared` for `ms`, whatever the call's own limit.
export async function effect (input: { ms: number }, context: any) {
  await context.atom.lock('shared', async () => {
    context.state.holding = true
    await new Promise((resolve) => setTimeout(resolve, input.ms))
  })
  context.state.holding = false
  return null
}
