// Takes a lock and calls another operation from inside a call: both carry the trace this one
// was given.
export async function computation (input: null, context: any) {
  await context.atom.lock('relay', async () => {})
  return context.local.echo({ input: { relayed: true }, instance: context.instance })
}
