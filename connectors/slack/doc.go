// Package slack is the connector that posts a row as a Slack message, with
// chat.postMessage through github.com/slack-go/slack.
//
// # Payload
//
//	{"channel": "C0123ABCD", "text": "order 42 paid", "blocks": [...], "thread_ts": "1700000000.000100"}
//
// "channel" is a conversation ID (C…, G… or D…) and is required: a retry looks the key
// up in that conversation's history, which Slack only serves by ID, so names such as
// "#general" and user IDs are refused. At least one of "text" and a non-empty "blocks"
// (a JSON array of at most 50 Block Kit blocks, as Slack takes in a message, which must
// decode with [github.com/slack-go/slack.Blocks]) is required; with
// blocks, "text" is the notification fallback. Blocks are sent as the payload writes them,
// with any field slack-go does not model. "thread_ts" makes the message a reply in
// that thread (naming a reply, it names the reply's thread, as Slack takes it); it must
// be written as Slack writes a ts ("1700000000.000100"), for Slack answers "ok" to one
// written otherwise (a float's digits, trailing zeros dropped) and posts a reply seen in
// no thread and not in the channel. Any other field is refused, so a misspelt one does not vanish silently.
// [ValidatePayload] runs the same checks.
//
// Each message carries the row's key in its message metadata:
//
//	{"event_type": "outboxd_intent", "event_payload": {"idempotency_key": "<key>"}}
//
// The row's headers (traceparent) are not sent. The token travels the way slack-go sends
// it, as the "token" field of the form body; the Web API root comes from configuration,
// never from rows.
//
// # Guarantee
//
// Slack does not dedupe posts, so the connector reconciles ([connectors.Reconciled]).
// On any attempt after the first, and on any attempt after an ambiguous one, it first
// reads the conversation with include_all_metadata: conversations.history, or for a
// thread reply conversations.replies of the thread's parent (replies are not in a
// channel's history, and Slack answers for a reply's ts with that reply alone; when the
// thread is gone, Slack posts a reply to it in the channel, so the history is read),
// [Config.HistoryLimit] messages a page, up to 10 pages, only the messages since 10
// minutes before the row's first attempt (connectors.Delivery.FirstAttemptAt; all of
// them when it is unknown). A page that says there are more messages but gives no
// cursor for them ends the lookup unfinished: nothing is posted, and the next attempt
// looks again. An answer is read to at most 1 MiB for a post and 64 KiB a message asked for
// (at least 1 MiB) for a lookup's page. If a message whose metadata carries the key is
// there, Deliver returns it without posting:
//
//	{"channel": "C0123ABCD", "ts": "1700000000.000200", "reconciled": true}
//
// A successful post returns {"channel": "...", "ts": "..."}.
//
// The lookup has limits an operator should know. When the pages run out before the
// messages since the first attempt do (a busy conversation, a long backoff), it cannot
// tell whether an earlier attempt posted: the row goes to dead with an error that is
// ambiguous and permanent, and nothing is posted; check the conversation, then cancel the
// row or replay it with a new key. A message someone deleted is not found, and the retry
// posts again. So is one Slack had not yet made visible when the lookup read: an attempt
// that timed out while Slack was still at work may post after the retry has looked, and
// the retry then posts a second message. So is one stamped, by Slack's clock, more than
// 10 minutes before the first attempt's time, which is the relay's (corrected to the
// database's): a database clock that far ahead of Slack's hides every earlier attempt's
// message. Commercially distributed apps outside Slack's
// Marketplace (not a workspace's internal apps) may read 15 messages a page and one page
// a minute: a lookup that needs a second page is refused
// with ratelimited and retried until the row's attempts or age run out, without posting.
// The token needs the history scope of the conversation's kind
// (channels:history, groups:history, im:history, mpim:history) besides chat:write;
// without it the lookup fails with
// missing_scope, which is permanent. And the bot must be a member of the conversation:
// chat:write.public lets it post to a public channel it is not in, but a bot token reads
// the history only of conversations it is in, and the lookup fails with not_in_channel,
// which is permanent too. Either way the row goes to dead without posting again.
//
// # Outcomes
//
//   - Rate limits (HTTP 429 with Retry-After, seconds or an HTTP date) are retried no sooner than Slack asks
//     ([connectors.RetryAfter]), and so are 408, 409, 425 and 5xx that carry one (a 503
//     of Slack's or of a proxy in front of it); without it they are retried with
//     backoff. A 502 or 504 answering a post is a gateway's answer for Slack, which may
//     have posted behind it, so it is also marked [connectors.Ambiguous].
//   - Slack's service_unavailable, request_timeout and ratelimited answers are retried,
//     and so are team_added_to_org and org_login_required (a workspace migrating into an
//     Enterprise organization, unavailable until the migration completes),
//     message_limit_exceeded (a free workspace's limit on messages in a short period), and a
//     lookup's invalid_cursor (a cursor Slack handed out that it no longer takes);
//     internal_error and fatal_error, which Slack says may follow a partial effect, are
//     retried and marked [connectors.Ambiguous] when they answer a post.
//   - Every other Slack error code is permanent ([connectors.Permanent]): it names a
//     problem with the request, the token or the conversation that the same row will
//     meet again — channel_not_found, not_in_channel, is_archived, invalid_auth,
//     account_inactive, token_revoked, msg_too_long, invalid_blocks, missing_scope and
//     the rest. So are other HTTP statuses (3xx, other 4xx: a wrong APIBase) and an
//     invalid payload.
//   - Network errors and timeouts are retried. When they happen after the whole post
//     was written (seen with net/http/httptrace), Slack may have posted the message,
//     and the error is also marked ambiguous; the next attempt looks first. A failed
//     lookup is never ambiguous: it posts nothing.
//   - So is an HTTP 200 that is not an answer of the Web API, whose every answer says
//     "ok": true, or false with an error code (a wrong APIBase, a proxy's own reply),
//     a post's "ok" without the message's ts, and a lookup's "ok" without the messages
//     (Slack's is an empty list when there are none: read as one, the retry would post
//     again): answering a post, what answered may have passed it on, so it is ambiguous
//     too.
//
// [Config.Timeout] bounds one attempt, lookup and post together; an attempt that runs
// past it wraps [ErrTimeout].
//
// slack-go's own retries (slack.OptionRetry) are not used: the relay owns retries, and a
// library that resent a post would make a second message the relay never sees. For the
// same reason redirects are not followed.
package slack
