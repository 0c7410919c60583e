// An error code the manifest does not declare: the agent takes it as the program's failure.
export async function computation () {
  return new Error('STRAY')
}
