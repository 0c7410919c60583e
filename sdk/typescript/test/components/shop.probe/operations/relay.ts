// Calls another operation from inside a call: the call carries the trace this one was given.
export async function computation (input: null, context: any) {
  return context.local.echo({ input: { relayed: true }, instance: context.instance })
}
