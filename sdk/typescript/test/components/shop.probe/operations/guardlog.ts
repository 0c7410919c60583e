export async function computation (input: null, context: any) {
  return { guarded: context.state.guarded ?? [], holding: context.state.holding ?? false }
}
