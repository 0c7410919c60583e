// Passes on a code of the runtime's own (an object's CONFLICT, as a call it made answered it):
// no declaration needed.
export async function computation () {
  return new Error('CONFLICT')
}
