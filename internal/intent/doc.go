// Package intent is the policy behind the intent HTTP API and the MCP tools: who may
// write, read and decide intents, and the calls that do it. Both faces are thin layers
// over a [Service]; the writes go through [outbox.Enqueue] and the operator functions of
// internal/ops, so validation, idempotency and the audit trail are the same everywhere.
//
// # Tokens
//
// A [Token] is configured in OUTBOX_API_TOKENS (read with [ParseTokens]) as a name, the
// SHA-256 of the secret in hex, the connector instances it may use and whether it is an
// admin. Only the hash is stored, and [Policy.Authenticate] compares it in constant time
// against every token. [NewToken] makes a fresh secret and its hash.
//
// A token's connectors are exact instances ("webhook", "webhook:crm"), "kind:*" for
// every instance of a kind (the plain kind included), or "*" for all. A token cannot
// create, read or list intents of other connectors: reading one answers as if it did not
// exist. Only admin tokens approve, reject and cancel.
//
// # Copies
//
// An operator who re-executes an intent's operation under a new key (outboxd replay
// --new-key) makes a copy of its row and leaves the row itself dead or held.
// [Service.CopiesOf] names that copy for a read of the row (and, for a read of the copy,
// the row it copies), so that a client follows the operation rather than taking it for
// failed, a whole page of [Service.List] at once; [Service.Notes] adds why a canceled or
// dead one's receiver may have acted.
//
// # Approval
//
// Intents for the connectors in [Policy.ApprovalRequired] start awaiting_approval; an
// admin approves them (they become pending) or rejects them (canceled). Deciding twice
// the same way is harmless; approving a rejected or canceled intent is refused with
// [ErrConflictState].
package intent
