// components/terminals/receivers/store.orders.cancelled.ts
export const request = (payload: { terminal: string, holder: string }) => ({
  input: { terminal: payload.terminal },
  instance: payload.holder
})
