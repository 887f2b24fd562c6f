// Package email is the connector that sends a row as one email, over one of two
// transports: an SMTP server, with github.com/wneessen/go-mail ([New]; guarantee
// forwarded: the Message-ID derived from the key travels, but no SMTP server is known to
// enforce it), or Resend's HTTP API ([NewResend]; guarantee enforced: Resend dedupes on
// the Idempotency-Key header for 24 hours). Both take the same payload.
//
// # Payload
//
//	{
//	  "to": "a@example.com",                 // or a list; required
//	  "cc": ["B <b@example.com>"],           // optional, string or list
//	  "bcc": "audit@example.com",            // optional: an envelope recipient, never a header
//	  "reply_to": "support@example.com",     // optional
//	  "subject": "Your order shipped",
//	  "text": "plain body",                  // text, html or both (multipart/alternative)
//	  "html": "<p>html body</p>",
//	  "headers": {"X-Tenant": "acme"}        // optional extra headers
//	}
//
// Unknown fields, unparsable addresses, a missing "to" or body, and headers that would
// replace one the connector sets (Message-ID, Idempotency-Key, From, To, Cc, Bcc,
// Reply-To, Subject, Date, Content-*, ...) are refused with [connectors.Permanent], and
// so, through Resend, which makes header lines of them as given, are a subject or an
// address with a control character (over SMTP, go-mail encodes them; the outbox package
// refuses such a row for every email instance, so only a row written by plain SQL gets
// this far). Over SMTP, User-Agent and X-Mailer say "outboxd" unless the payload gives its own. The
// row's own [connectors.Delivery.Headers] (such as traceparent) are not copied into the
// mail, whose headers every recipient can read.
//
// # The key
//
// Every attempt for a row carries the same
//
//	Message-ID: <first 32 hex digits of SHA-256(key)@domain of From>
//	Idempotency-Key: <the row's key>
//
// (see [MessageID]), so a receiver that dedupes on Message-ID keeps one copy. SMTP
// servers are not known to do so, hence the guarantee [connectors.Forwarded].
//
// # Connection
//
// Each attempt opens a new connection to [Config.Addr], upgrades it with STARTTLS
// according to [Config.TLS], authenticates when [Config.Username] is set (the strongest
// mechanism offered; PLAIN and LOGIN only over TLS or to a loopback server), runs one
// mail transaction and says QUIT. The whole attempt is bounded by [Config.Timeout], and
// cancelling the context closes the connection.
//
// # Outcomes
//
// On success the stored result is
//
//	{"message_id": "<...@shop.example>", "accepted": ["a@example.com", "audit@example.com"], "server_reply": "250 2.0.0 OK: queued"}
//
// Failures are classified for the relay:
//
//   - Failing to connect, greet, STARTTLS or authenticate, or a refused MAIL FROM (which
//     carries only the configured sender), is retried, even on a 5xx reply: nothing was
//     sent, and the fault lies with the server or the configuration, not the row.
//   - A 4xx reply to RCPT, DATA or the message is retried; a 5xx reply is permanent,
//     except 530 (authentication required, RFC 4954), which is about the configuration
//     and retried as a refused MAIL FROM is. The reply stays in the error chain as a
//     *[textproto.Error] (errors.As finds it). A message goes to all its recipients or
//     none: one rejected recipient fails the attempt. Any 2xx reply to the message (not
//     only 250, and a bare code without text too) means the server took it; a reply to
//     it that is neither 2xx, 4xx nor 5xx is marked [connectors.Ambiguous], as the
//     server may have queued the message.
//   - A connection that breaks before the end of the message is retried: the server
//     cannot accept a message whose final "." it never received.
//   - A connection that breaks, or an attempt that times out or is cancelled, after the
//     whole message was sent and before the server replied is retried and marked
//     [connectors.Ambiguous]: the server may have queued it, and a retry may deliver a
//     second copy with the same Message-ID.
package email
