// The call this operation answers, as the context says it.
export async function computation (input: null, context: any) {
  return context.call
}
