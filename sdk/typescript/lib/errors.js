// A call that failed as a call. `code` tells them apart as the seeds do: 403 (Addressee: the
// process named is gone, safe to recover), 404 (Abandoned: the wait ended, the outcome is
// unknown), 202 (RequestContract: refused before anything was sent); `name` is the agent's code
// (`Addressee`, `Abandoned`, `RequestContract`, `UNKNOWN_COMPONENT`, `FAILED`, ...).
export class CallError extends Error {
  /** @param {import('./protocol.js').ErrorDetail} error the agent's refusal */
  constructor (error) {
    super(error.message ?? error.code)
    /** @type {number | string} */
    this.code = error.number ?? error.code
    this.name = error.code
  }
}

/** @param {string} message */
export const abandoned = (message) =>
  new CallError({ code: 'Abandoned', number: 404, message })

/** @param {string} message */
export const contract = (message) =>
  new CallError({ code: 'RequestContract', number: 202, message })
