// What a task ran with, kept for `calls` to see.
export async function effect (input: { n: number }, context: any) {
  context.state.tasked = [...(context.state.tasked ?? []), input.n]
  return null
}
