export interface StageOptions {
  /** context.toa.yaml to read (default: none, the embedded default). */
  context?: string
  environment?: string
  /** Variables for the agent and the programs. */
  env?: Record<string, string>
  /** The agent binary (default: $TOA_AGENT_BIN, else `toa-agent` on PATH). */
  agent?: string
}

export interface Stage {
  /** The agent's local API, e.g. `http://127.0.0.1:40123`. */
  readonly address: string
  /** Calls `component.operation`: the reply, or the operation's own error as an `Error` with `code`; a failed call throws `CallError`. */
  call (target: string, request?: { input?: unknown, instance?: string, timeout?: number }): Promise<any>
  /** Runs `pause` in every component (a halt). */
  halt (): Promise<void>
  /** Runs `resume`: the same processes, with their state. */
  restore (): Promise<void>
  /** Drains (dispose runs) and waits for the agent to exit; how it exited (`code` is the error's
   * message, and `signal` absent, when the agent could not be started). */
  stop (): Promise<{ code: number | string | null, signal?: NodeJS.Signals | null }>
  /** What the agent and the programs printed. */
  output (): string
}

/** Starts `toa-agent compose` on `components` and resolves once they are ready. */
export declare function compose (components: string[], options?: StageOptions): Promise<Stage>
