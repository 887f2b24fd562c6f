// Package webhook is the connector that POSTs a row's payload to one configured URL.
//
// Each attempt sends the payload verbatim as the body, with
//
//	Content-Type: application/json
//	Idempotency-Key: <the row's key>
//	User-Agent: outboxd
//
// plus the row's own headers (such as traceparent; one of a name the connector or the
// transport sets, such as Content-Type, Idempotency-Key, User-Agent, Host,
// Accept-Encoding, or the webhook-id, webhook-timestamp and webhook-signature it signs
// with, is dropped), and, when the URL has a user name
// (https://user:pass@host/hook), HTTP Basic authentication from it unless the row carries
// its own Authorization header (as net/http's client does). When [Config.Secret] or
// [Config.Secrets] is set, the request is also signed the Standard Webhooks way
// (https://www.standardwebhooks.com):
//
//	webhook-id: <the row's key>
//	webhook-timestamp: <unix seconds of this attempt>
//	webhook-signature: v1,<base64 of HMAC-SHA256(secret, id + "." + timestamp + "." + body)>
//
// where the secret is the base64 part of a "whsec_…" value. The id is the key, so it is
// the same on every attempt, while the timestamp and signature are fresh each time, as
// the specification asks. Target URLs come only from configuration, never from rows.
//
// # Rotating the secret
//
// With several secrets ([Config.Secrets], or several in [Config.Secret] separated by
// white space) the header carries one signature per secret, in the order given,
// separated by spaces:
//
//	webhook-signature: v1,<signature with the old secret> v1,<signature with the new>
//
// A Standard Webhooks receiver accepts the request when any of them matches its secret,
// so a secret is replaced without a refused delivery (a 401 is permanent, so the row
// would go dead): add the new secret after the old, give the receivers the new one,
// then remove the old.
//
// # Outcomes
//
// A 2xx answer is success; the stored result is
//
//	{"status": 200, "body": "<at most MaxResultBody bytes, valid UTF-8>", "truncated": true}
//
// with "truncated" present only when the body was cut. Failures return the same result
// next to an error classified for the relay:
//
//   - 408, 409, 425, 429 and 5xx are retried, no sooner than a Retry-After header says
//     (delta-seconds, or an HTTP date, measured from the answer's Date) when there is
//     one ([connectors.RetryAfter]); a Retry-After over a year ahead is ignored. 502
//     Bad Gateway and 504 Gateway Timeout, and Cloudflare's 520 and 524 (its own codes
//     for the same), are a gateway's answer for a receiver it passed the request to,
//     which may have acted: they are also ambiguous ([connectors.Ambiguous]), so an
//     instance that holds ambiguous attempts holds them.
//   - 3xx is permanent: redirects are not followed, so a receiver that moved must be
//     configured with its final URL. 303 See Other, which answers a request the server
//     took, is also ambiguous: the receiver may have acted.
//   - Other 4xx are permanent ([connectors.Permanent]), and so is 101 Switching Protocols,
//     whose connection is closed unread: it is no answer to a webhook.
//   - A row that cannot make a well-formed request (a key or a header with a control
//     character, two header names that differ only in case, a payload that is not JSON)
//     is permanent without a request.
//   - Network errors and timeouts are retried. When they happen after the whole request
//     was written (seen with net/http/httptrace), the receiver may have acted, and the
//     error is also marked [connectors.Ambiguous]. So is an answer whose headers exceed
//     [connectors.MaxAnswerHeaderBytes] (64 KiB), which [DefaultTransport] does not read.
//
// # Guarantee
//
// A receiver is not known to dedupe on Idempotency-Key, so the connector declares
// [connectors.Forwarded] unless the operator sets [Config.Guarantee] to
// [connectors.Enforced] for a receiver that does.
//
// # Transport
//
// Connectors without their own [Config.Client] share one keep-alive transport,
// [DefaultTransport], so connections to a receiver are reused across rows. The transport's
// own silent resend of a request that carries an Idempotency-Key is turned off: the relay
// owns retries, and must see an ambiguous attempt rather than have it hidden.
//
// [DefaultTransport] asks for no compressed answers; a receiver that gzips its answer all
// the same has it read decompressed, and one whose Content-Encoding says gzip of an
// answer that is not has it read as sent.
//
// Like net/http's default transport, [DefaultTransport] goes through the proxy that
// HTTPS_PROXY or HTTP_PROXY names, except to the hosts NO_PROXY lists and to loopback
// ones. Errors then name the proxy ("POST https://host/xxxxx (through the proxy
// http://proxy:3128): ..."), as its refusal would otherwise read as the receiver's.
package webhook
