// The operation's own error: returned, with a code in the message (as the seeds write it).
export function computation () { return new Error('NOPE') }
