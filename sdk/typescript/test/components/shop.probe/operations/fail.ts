// A thrown exception is a failure, not the operation's error.
export function computation () { throw new Error('broken on purpose') }
