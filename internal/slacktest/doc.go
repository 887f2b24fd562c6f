// Package slacktest is a fake Slack Web API on loopback, just enough of chat.postMessage,
// conversations.history and conversations.replies for slack-go. The slack connector's
// tests and the relay's crash tests post to it and then ask it what it holds.
//
//	f := slacktest.Start(t, slacktest.Options{})
//	c, err := slack.New(slack.Config{Token: slacktest.Token, APIBase: f.APIBase()})
//	// deliver through c ...
//	require.Equal(t, 1, f.Effects("order-42:announce"))
//
// # Semantics
//
// Every method takes the token as slack-go sends it (a "token" form field) or as a bearer
// header, and reads its parameters from the query, a form body or a JSON body; a wrong
// token gets {"ok":false,"error":"invalid_auth"}. chat.postMessage stores each message
// with its metadata, per channel, under a ts taken from the wall clock (unique, as Slack's
// are), and notes the idempotency key that its metadata carries when the metadata's
// event_type is [EventType] and its payload has [KeyField]. Those two are the fake's own
// idea of where the key rides, so that the connector's tests can check its exported names
// against them. A thread_ts naming a reply posts in its parent's thread, as Slack does.
//
// conversations.history answers a channel's top-level messages newest first, and
// conversations.replies a thread oldest first (or, given a reply's ts, that reply
// alone, as Slack does); both page with a cursor, honour "oldest" and "limit" (see
// [Server.CapLimit]), and show the metadata only when include_all_metadata asks for it.
//
// # Plans
//
// [Server.Plan] scripts the answers to one key's next posts and [Server.PlanLookup] those
// to the next history and replies requests: an HTTP status (with a Retry-After), a Slack
// error, a body that is not Slack's, or, for a post, storing the message and then dropping
// the connection, hanging, or answering a gateway's status: the failures after which the
// sender cannot know whether Slack posted.
//
// # Hooks
//
// [Options.OnPostFunc] is called with each stored message's key, on the request's
// goroutine, before the answer, so a test can block there to hold the answer back (the
// relay's crash tests kill the relay process meanwhile). [Server.Effects], [Server.Posts]
// and [Server.TS] then tell how many messages carry a key, how many posts asked for it,
// and which message is its.
package slacktest
