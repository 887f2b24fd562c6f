// Package mcpserver serves the intent tools over the Model Context Protocol, with
// github.com/modelcontextprotocol/go-sdk: `outboxd mcp` over stdio ([ServeStdio]) and
// `outboxd serve` at /mcp over streamable HTTP ([Handler]). It is a thin face over
// [intent.Service]; it holds no policy of its own.
//
// # Tools
//
//   - propose_intent writes an intent (connector, key or key_parts, payload, reason,
//     ordering_key, not_before) with [intent.Service.Create]: the same decision under
//     the same key returns the existing intent, a different one under an old key is a
//     tool error naming the key.
//   - get_intent reads one intent: status, attempts, last error, stored result, and the
//     copies an operator made to re-execute its operation under a new key
//     ([intent.Service.CopiesOf]) or whether, canceled or dead, its receiver may have acted
//     ([intent.Service.MayHaveActed]), which propose_intent (for a decision proposed
//     again) and list_intents say too.
//   - list_intents reads a page of intents, only of the connectors the token may use.
//
// Tool input schemas are generated from the Go input types. Failures the agent can act
// on (a forbidden connector, a key conflict, an invalid payload, an unknown key) are tool
// errors whose text says what to do next. So are a database that is unavailable and a
// transaction PostgreSQL ended on a conflict with concurrent work (a serialization
// failure or a deadlock, [intent.Contended]), which the intent API answers 503: calling
// again with the same key is safe. The rest are logged and reported as an internal error
// that is safe to retry with the same key. Each call is bounded by
// [Config.CallTimeout], so a database that does not answer is a tool error, not a hang.
//
// # Identity
//
// Every tool call acts as one [intent.Token], so the same policy as the HTTP API
// applies. Over stdio the token is fixed when the command starts (OUTBOX_MCP_TOKEN);
// over HTTP each request carries Authorization: Bearer <token>, and a session stays
// bound to the token that opened it.
package mcpserver
