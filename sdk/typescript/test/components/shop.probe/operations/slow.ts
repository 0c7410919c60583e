export async function computation (input: { ms: number }) {
  await new Promise((resolve) => setTimeout(resolve, input.ms))
  return 'late'
}
